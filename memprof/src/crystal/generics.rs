//! Crystal's generic type names (`Hash(K, Array(V))`): their arguments,
//! whether a parameter is left in them, a generic's parameters replaced by
//! an instance's arguments.

/// Whether a type name still has a type parameter in it (`Hash(T, Nil)`):
/// an argument that is one capital letter, as the standard library names them.
pub fn has_parameter(name: &str) -> bool {
    name.split(['(', ')', ',', '|', ' '])
        .any(|w| w.len() == 1 && w.as_bytes()[0].is_ascii_uppercase())
}

/// The top-level arguments of `Name(A, B(C))`: `["A", "B(C)"]`; the
/// parentheses that follow the name only (`Foo(T)+`, `Foo(T).class`: the
/// suffix is not an argument), nothing when they are not closed.
pub fn type_args(name: &str) -> Vec<&str> {
    let Some(open) = name.find('(') else {
        return Vec::new();
    };
    let Some(len) = super::symbol::balanced_end(&name[open..]) else {
        return Vec::new();
    };
    let inner = &name[open + 1..open + len - 1];
    let (mut args, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, b) in inner.bytes().enumerate() {
        match b {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b',' if depth == 0 => {
                args.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    args.push(inner[start..].trim());
    args
}

/// The last path segment of a type, without arguments (`Set` of `Foo::Set(T)`).
fn generic_base(name: &str) -> &str {
    let path = name.split('(').next().unwrap_or(name);
    path.rsplit("::").next().unwrap_or(path)
}

/// Whether two types are the same generic (`Set(T)`, `Set(Int32)`).
pub fn same_generic(a: &str, b: &str) -> bool {
    generic_base(a) == generic_base(b)
}

/// `made` with the parameters of the generic type `within` (`Set(T)`)
/// replaced by the arguments of its `instance` (`Set(BasicBlock)`), when
/// both are the same generic type.
pub fn substitute(made: &str, within: &str, instance: &str) -> String {
    let (params, args) = (type_args(within), type_args(instance));
    if !same_generic(within, instance) || params.len() != args.len() || params.is_empty() {
        return made.to_string();
    }
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let arg = params
            .iter()
            .position(|p| *p == word.as_str())
            .map(|i| args[i]);
        out.push_str(arg.unwrap_or(word));
        word.clear();
    };
    for c in made.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_parameters_and_substitution() {
        assert!(has_parameter("Hash(T, Nil)"));
        assert!(has_parameter("Deque(T)"));
        assert!(!has_parameter("Hash(Thread, Crystal::Event)"));
        assert!(!has_parameter("Time::Location"));
        assert_eq!(type_args("Hash(K, Array(V))"), vec!["K", "Array(V)"]);
        assert_eq!(type_args("Foo(T)+"), vec!["T"]);
        assert_eq!(type_args("Foo(A, B).class"), vec!["A", "B"]);
        assert_eq!(
            type_args("Hash(String, NamedTuple(a: Int32, b: Proc(Int32, Nil)))"),
            vec!["String", "NamedTuple(a: Int32, b: Proc(Int32, Nil))"]
        );
        assert!(type_args("Hash(K,").is_empty());
        assert_eq!(
            substitute("Hash(T, Nil)", "Set(T)", "Set(BasicBlock)"),
            "Hash(BasicBlock, Nil)"
        );
        assert_eq!(
            substitute(
                "Hash(K, Array(V))",
                "Foo::Multi(K, V)",
                "Multi(Int32, String)"
            ),
            "Hash(Int32, Array(String))"
        );
        // Another generic, or other arity: unchanged.
        assert_eq!(
            substitute("Hash(T, Nil)", "Set(T)", "Array(Int32)"),
            "Hash(T, Nil)"
        );
    }
}
