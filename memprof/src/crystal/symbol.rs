//! Parsing a Crystal method symbol (`*Owner[@Defining](#|::)name…`) into
//! the owner, the kind of method and its name.

/// A Crystal method symbol, split into the parts reports use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Method<'a> {
    /// The receiver's type (`Array(Int32)`, virtual `+` and `.class` removed);
    /// `None` for top-level methods.
    pub owner: Option<&'a str>,
    /// A class method (`Foo.new`), not an instance method (`Foo#bar`).
    pub class_method: bool,
    /// The method's name (`push`, `<<`, `[]?`, `size=`), without named arguments.
    pub name: &'a str,
    /// The type whose code this is, after `@` (`Array(T)` of
    /// `*Array(Int32)@Array(T)#push`, a module, `Object`): its type
    /// parameters are named as the source names them.
    pub defining: Option<&'a str>,
}

/// Parses a Crystal method symbol (`*…`); `None` for anything else.
pub fn parse_method(raw: &str) -> Option<Method<'_>> {
    let body = raw.strip_prefix('*')?;
    let mut p = Cursor { s: body, i: 0 };
    p.file_prefix();
    let (owner, defining) = if p.at_method_start() {
        (None, None)
    } else {
        let start = p.type_path()?;
        let owner = &body[start..p.i];
        let defining = if p.eat("@") {
            let start = p.type_path()?;
            Some(&body[start..p.i])
        } else {
            None
        };
        (Some(owner), defining)
    };
    let class_method = match owner {
        None => false,
        Some(_) if p.eat("::") => true,
        Some(_) if p.eat("#") => false,
        Some(_) => return None,
    };
    let name = p.method_name()?;
    p.named_args();
    if !(p.rest().is_empty() || p.rest().starts_with(['<', ':'])) {
        return None;
    }
    // `Foo.class#bar` is a class method written as a metaclass instance method.
    let (owner, class_method) = match owner.map(|o| o.trim_end_matches('+')) {
        Some(o) => match o.strip_suffix(".class") {
            Some(o) => (Some(o.trim_end_matches('+')), true),
            None => (Some(o), class_method),
        },
        None => (None, false),
    };
    Some(Method {
        owner,
        class_method,
        name,
        defining,
    })
}

/// Where the `(…)` that `text` starts with ends (just after its `)`), with
/// nested parentheses and quoted named-tuple keys (`NamedTuple("a)": Int32)`)
/// skipped; `None` when it is not closed.
pub fn balanced_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quoted = false;
    let bytes = text.as_bytes();
    let mut k = 0;
    while k < bytes.len() {
        match bytes[k] {
            b'\\' if quoted => k += 1,
            b'"' => quoted = !quoted,
            _ if quoted => {}
            b'(' => depth += 1,
            b')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(k + 1);
                }
            }
            _ => {}
        }
        k += 1;
    }
    None
}

/// A position in a symbol being parsed.
pub(super) struct Cursor<'a> {
    s: &'a str,
    i: usize,
}

/// Operator method names, longest first so `<=>` wins over `<=` and `<`.
const OPERATORS: &[&str] = &[
    "&**", "<=>", "===", "[]?", "[]=", "[]", "**", "==", "!=", "=~", "!~", "<<", ">>", "<=", ">=",
    "&+", "&-", "&*", "//", "<", ">", "+", "-", "*", "/", "%", "&", "|", "^", "~", "!",
];

impl<'a> Cursor<'a> {
    fn rest(&self) -> &'a str {
        &self.s[self.i..]
    }

    fn peek(&self) -> Option<u8> {
        self.s.as_bytes().get(self.i).copied()
    }

    fn eat(&mut self, token: &str) -> bool {
        if self.rest().starts_with(token) {
            self.i += token.len();
            true
        } else {
            false
        }
    }

    /// A method name starts here (lowercase identifier or operator), not a type.
    fn at_method_start(&self) -> bool {
        if self.rest().starts_with("struct.") || self.rest().starts_with("union.") {
            return false;
        }
        match self.peek() {
            Some(b) => {
                b.is_ascii_lowercase() || b == b'_' || (!b.is_ascii_alphanumeric() && b != b'/')
            }
            None => false,
        }
    }

    fn ident(&mut self) -> &'a str {
        let start = self.i;
        while self
            .peek()
            .is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            self.i += 1;
        }
        &self.s[start..self.i]
    }

    /// `(…)` with nested parentheses; the contents are not checked.
    fn parens(&mut self) -> Option<()> {
        self.i += balanced_end(self.rest())?;
        Some(())
    }

    /// Skips the `/path/file.cr::` that qualifies file-private types and methods.
    fn file_prefix(&mut self) {
        if let Some(at) = self.rest().find(".cr::") {
            if !self.rest()[..at].contains(['<', '(', '#', '@', ':', ' ']) {
                self.i += at + ".cr::".len();
            }
        }
    }

    /// `A::B(T)::C+`, `Foo.class`, `struct.LibC::Timeval`, or a file-private
    /// `/path/file.cr::Type`; returns where the type's name starts (after the
    /// `struct.` or file prefix).
    fn type_path(&mut self) -> Option<usize> {
        for prefix in ["struct.", "union."] {
            self.eat(prefix);
        }
        self.file_prefix();
        let start = self.i;
        loop {
            if !self.peek().is_some_and(|b| b.is_ascii_uppercase()) {
                return None;
            }
            self.ident();
            if self.peek() == Some(b'(') {
                self.parens()?;
            }
            let next_is_type = self
                .rest()
                .strip_prefix("::")
                .is_some_and(|r| r.as_bytes().first().is_some_and(|b| b.is_ascii_uppercase()));
            if !next_is_type {
                break;
            }
            self.i += 2;
        }
        self.eat("+");
        while self.eat(".class") {}
        self.eat("+");
        Some(start)
    }

    /// `push`, `empty?`, `size=`, `<<`, `[]?`: an identifier with its suffix,
    /// or the longest operator after which a signature (`<`, `:`) or nothing follows.
    fn method_name(&mut self) -> Option<&'a str> {
        let start = self.i;
        if self
            .peek()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        {
            self.ident();
            if matches!(self.peek(), Some(b'?' | b'!' | b'=')) {
                self.i += 1;
            }
            return Some(&self.s[start..self.i]);
        }
        for op in OPERATORS {
            if let Some(after) = self.rest().strip_prefix(op) {
                if after.is_empty() || after.starts_with(['<', ':']) {
                    self.i += op.len();
                    // The symbol's own text, so a name's place in it is known.
                    return Some(&self.s[start..self.i]);
                }
            }
        }
        None
    }

    /// `:file:encoding`: the named arguments of an overload, skipped. A return
    /// type (`:String`, `:(A | B)`) starts otherwise.
    fn named_args(&mut self) {
        loop {
            let Some(after) = self.rest().strip_prefix(':') else {
                return;
            };
            if !after
                .as_bytes()
                .first()
                .is_some_and(|b| b.is_ascii_lowercase() || *b == b'_')
            {
                return;
            }
            let mut probe = Cursor {
                s: self.s,
                i: self.i + 1,
            };
            probe.ident();
            let next = probe.rest();
            if next.is_empty()
                || next.starts_with('<')
                || next.starts_with(':') && !next.starts_with("::")
            {
                self.i = probe.i;
            } else {
                return;
            }
        }
    }
}
