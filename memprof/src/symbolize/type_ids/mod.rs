//! Names of Crystal type ids, read from the program's own code.
//!
//! A Crystal object starts with its class's 32-bit type id, which the
//! compiler stores right after allocating it: `Foo.new` (a debug build's
//! `*Foo::new<Int32>:Foo`, or `*Foo::allocate:Foo`) calls
//! `__crystal_malloc64` (or `_atomic64` for a class without pointers) and
//! then writes `movl $ID,(%reg)`:
//!
//! ```text
//! *Author::new<Int32>:Author:
//!   call   __crystal_malloc_atomic64
//!   …      (memset, spills)
//!   movl   $0xad,(%rcx)         // Author is type 173
//! ```
//!
//! [`type_names`] decodes every such constructor of the executable and
//! keeps the first 32-bit immediate stored at offset 0 of a register after
//! each call to an allocator; `String`'s id is the constant
//! `String::TYPE_ID` the program carries. Release builds inline `new` into
//! its callers: there the id is stored after the allocation the same way,
//! and the DWARF of the inlined `new` gives its `file:line` in the class
//! body, whose class the source names ([`crate::crystal::source`]); ids
//! with neither stay unnamed (`(type 123)` in reports).
use std::collections::{BTreeMap, HashMap};

use iced_x86::{Code, FlowControl, Instruction, Mnemonic, OpKind, Register};

mod held;

use super::inlined_new::inlined_new_owners;
use crate::crystal::generics::has_parameter;
use crate::crystal::parse_method;
use crate::modules::Module;
use crate::x86::{decode, plt};
use held::{read_only_word, Held};

/// The functions the compiler allocates objects with, and whether they
/// allocate pointer-free (atomic) memory.
const ALLOCATORS: &[(&str, bool)] = &[
    ("__crystal_malloc64", false),
    ("__crystal_malloc_atomic64", true),
    ("__crystal_malloc", false),
    ("__crystal_malloc_atomic", true),
    ("GC_malloc", false),
    ("GC_malloc_atomic", true),
];

/// Instructions looked at after an allocator call for the id's store.
const WINDOW: usize = 40;

/// The highest type id believed: larger constants stored after an
/// allocation are data (`movl $0x2e2e2e2e,(%rax)`: "....").
pub(crate) const MAX_TYPE_ID: u32 = 1 << 16;

/// Places an unnamed id is looked up at in the DWARF.
const SITES_PER_ID: usize = 16;

/// Longest constructor decoded (its symbol size, when it has one).
const MAX_CODE: usize = 16 << 10;

/// The kinds of memory a type id was seen stored in (bits).
const NORMAL: u8 = 1;
const ATOMIC: u8 = 2;

/// Crystal type ids and the classes they name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeNames {
    pub names: BTreeMap<u32, String>,
    /// Every id the code stores right after an allocation, named or not
    /// (release builds store them in the callers `new` was inlined into),
    /// with the kinds of memory it was stored in ([`NORMAL`], [`ATOMIC`]):
    /// a class with pointers is always allocated scanned, one without
    /// always atomic.
    pub stored: BTreeMap<u32, u8>,
    /// The sizes the code allocates each id's objects with, for the ids
    /// whose every allocation the code sizes by a constant (a class's
    /// instance size): a word equal to the id in an object of another
    /// size is a buffer's data, not its class.
    pub sizes: BTreeMap<u32, Vec<u64>>,
}

/// What a first word is, for [`TypeNames::type_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeOf<'a> {
    Named(&'a str),
    /// A type id no constructor names.
    Unnamed,
    /// Not a type id (a buffer's data).
    NotAType,
}

impl TypeNames {
    pub fn name(&self, id: u32) -> Option<&str> {
        self.names.get(&id).map(String::as_str)
    }

    /// The highest id known: Crystal numbers its types densely from 1, so
    /// a first word above it is not a type id.
    pub fn max_id(&self) -> u32 {
        let named = self.names.keys().next_back().copied().unwrap_or(0);
        named.max(self.stored.keys().next_back().copied().unwrap_or(0))
    }

    /// What the first word `id` of a live object is, in memory that is
    /// `atomic` or not, of `size` requested bytes ([`TypeNames::sizes`]).
    pub fn type_of_sized(&self, id: u32, atomic: bool, size: u64) -> TypeOf<'_> {
        match self.sizes.get(&id) {
            Some(sizes) if !sizes.contains(&size) => TypeOf::NotAType,
            _ => self.type_of(id, atomic),
        }
    }

    /// What the first word `id` of a live object is, for an object the
    /// collector gave `given` bytes (its size class, from a census): the
    /// collector rounds a request up to a size class that fits its block
    /// evenly, never to twice the request and a few granules more, so a
    /// buffer whose data starts with the id of a class of known size is
    /// told apart by its size (an 8-KiB I/O buffer starting with a 16-byte
    /// class's id).
    pub fn type_of_given(&self, id: u32, atomic: bool, given: u64) -> TypeOf<'_> {
        let fits = |requested: u64| given >= requested && given <= 2 * requested + 64;
        match self.sizes.get(&id) {
            Some(sizes) if !sizes.iter().any(|&s| fits(s)) => TypeOf::NotAType,
            _ => self.type_of(id, atomic),
        }
    }

    /// What the first word `id` of a live object is, in memory that is
    /// `atomic` or not: a type id the code stores only into the other
    /// kind of memory is a buffer's data that looks like one.
    pub fn type_of(&self, id: u32, atomic: bool) -> TypeOf<'_> {
        let kind_fits = match self.stored.get(&id) {
            Some(&kinds) => kinds & if atomic { ATOMIC } else { NORMAL } != 0,
            None => true,
        };
        match self.name(id) {
            _ if !kind_fits || id == 0 || id > self.max_id() => TypeOf::NotAType,
            Some(name) => TypeOf::Named(name),
            None => TypeOf::Unnamed,
        }
    }
}

/// The type ids the code of `exe` stores after allocating, named after
/// the class of each constructor that stores one.
pub fn type_names(exe: &Module) -> TypeNames {
    let (allocators, constructors) = allocators_and_constructors(exe);
    let mut names = named_by_constructors(exe, constructors, &allocators);
    let Stores {
        mut stored,
        sites,
        mut calls,
        sizes,
    } = stores(exe, &allocators);
    let mut sizes: BTreeMap<u32, Vec<u64>> = sizes
        .into_iter()
        .filter_map(|(id, s)| Some((id, s?.into_iter().collect())))
        .collect();
    // A constant stored after an allocation that no type id can be
    // (Crystal programs have thousands of types, not millions): text, flags.
    stored.retain(|&id, _| id != 0 && id <= MAX_TYPE_ID);
    // Release builds: the store is in the caller `new` was inlined into;
    // DWARF says where the inlined `new` comes from in the source.
    // The allocator calls first: their inline chain is the object's `new`.
    for (id, at) in sites {
        calls.entry(id).or_default().extend(at);
    }
    for (id, name) in named_by_inlined_new(exe, calls, &stored, &names) {
        names.entry(id).or_insert(name);
    }
    if let Some(sym) = exe.symbol("String::TYPE_ID") {
        if let Some(bytes) = exe
            .bytes_at(sym.address)
            .filter(|_| exe.is_read_only(sym.address))
            .and_then(|b| b.get(..4))
        {
            let id = u32::from_le_bytes(bytes.try_into().unwrap());
            names.insert(id, "String".into());
            *stored.entry(id).or_default() |= ATOMIC;
            // A string's size is its text's: a literal's constant says
            // nothing of the others.
            sizes.remove(&id);
        }
    }
    TypeNames {
        names,
        stored,
        sizes,
    }
}

/// A class's constructor `new` or `allocate`: (class, address, size).
type Constructor = (String, u64, u64);

/// The allocators of `exe` (address: whether atomic), and its classes'
/// constructors.
fn allocators_and_constructors(exe: &Module) -> (HashMap<u64, bool>, Vec<Constructor>) {
    let mut allocators: HashMap<u64, bool> = ALLOCATORS
        .iter()
        .filter_map(|&(name, atomic)| exe.symbol(name).map(|s| (s.address, atomic)))
        .collect();
    // Release builds call libgc's through the PLT, inlined into callers.
    for (name, atomic) in [("GC_malloc", false), ("GC_malloc_atomic", true)] {
        allocators.extend(plt::stubs(exe, name).into_iter().map(|a| (a, atomic)));
    }
    let mut constructors = Vec::new();
    let versioned = exe
        .versioned_crystal_names()
        .iter()
        .map(|(&a, n)| (n.as_str(), a, 0));
    let all: Vec<(&str, u64, u64)> = exe
        .symbols()
        .map(|(n, s)| (n, s.address, s.size))
        .chain(versioned)
        .collect();
    for &(name, address, size) in &all {
        let Some(m) = parse_method(name) else {
            continue;
        };
        match m.owner {
            // `GC.malloc` & co: what `String.new` allocates with.
            Some("GC") if m.class_method && m.name.starts_with("malloc") => {
                allocators.insert(address, m.name.contains("atomic"));
            }
            Some(owner) if m.class_method && (m.name == "new" || m.name == "allocate") => {
                constructors.push((owner.to_string(), address, size));
            }
            _ => {}
        }
    }
    (allocators, constructors)
}

/// The ids the `constructors` store, named after their class.
fn named_by_constructors(
    exe: &Module,
    mut constructors: Vec<Constructor>,
    allocators: &HashMap<u64, bool>,
) -> BTreeMap<u32, String> {
    let mut names = BTreeMap::new();
    // Sorted, so that an id two constructors claim gets the same name every run.
    constructors.sort();
    for (owner, address, size) in constructors {
        if let Some(id) = constructed_id(exe, address, size, allocators) {
            names.entry(id).or_insert(owner);
        }
    }
    names
}

/// The constants the code stores into freshly allocated objects.
struct Stores {
    /// Per id: the kinds ([`ATOMIC`], [`NORMAL`]) of the objects it is stored into.
    stored: BTreeMap<u32, u8>,
    /// Where each id is stored, the first few places (for the ids no
    /// constructor names).
    sites: BTreeMap<u32, Vec<u64>>,
    /// The allocator calls whose object each id is stored into (their
    /// DWARF is the inlined `new`'s).
    calls: BTreeMap<u32, Vec<u64>>,
    /// Per id: the sizes of the allocations it is stored into; `None` once
    /// one was not a constant.
    sizes: BTreeMap<u32, Option<std::collections::BTreeSet<u64>>>,
}

impl Stores {
    /// Id `id` is stored into an allocation of `size` bytes (`None`: not known).
    fn sized(&mut self, id: u32, size: Option<u64>) {
        let entry = self
            .sizes
            .entry(id)
            .or_insert_with(|| Some(Default::default()));
        match (entry.as_mut(), size) {
            (Some(sizes), Some(size)) => {
                sizes.insert(size);
            }
            _ => *entry = None,
        }
    }
}

/// Every store of a constant into a freshly allocated object in `exe`.
fn stores(exe: &Module, allocators: &HashMap<u64, bool>) -> Stores {
    let mut found = Stores {
        stored: BTreeMap::new(),
        sites: BTreeMap::new(),
        calls: BTreeMap::new(),
        sizes: BTreeMap::new(),
    };
    // The kind of the last allocator call, and instructions since.
    let mut since_call: Option<(bool, usize)> = None;
    let mut held = Held::default();
    // The size each allocator call asks for, where a constant (`%rdi`).
    let mut call_sizes: HashMap<u64, Option<u64>> = HashMap::new();
    let mut last_size: Option<u64> = None;
    decode::sweep(exe, |insn| {
        // An id stored into an object a register still holds: that
        // allocation's, however far after it (release builds move the
        // store past the initializers' own allocations).
        let id = stored_id(insn).or_else(|| held.stored_constant(insn));
        if let Some((call, atomic, id)) =
            id.and_then(|id| held.get(insn.memory_base()).map(|(c, a)| (c, a, id)))
        {
            *found.stored.entry(id).or_default() |= if atomic { ATOMIC } else { NORMAL };
            let at = found.calls.entry(id).or_default();
            if at.len() < SITES_PER_ID && !at.contains(&call) {
                at.push(call);
            }
            found.sized(id, call_sizes.get(&call).copied().flatten());
            held.forget(insn.memory_base());
        }
        if let Some((atomic, id)) = since_call.and_then(|(a, _)| Some((a, stored_id(insn)?))) {
            *found.stored.entry(id).or_default() |= if atomic { ATOMIC } else { NORMAL };
            let at = found.sites.entry(id).or_default();
            if at.len() < SITES_PER_ID {
                at.push(insn.ip());
            }
            found.sized(id, last_size);
            since_call = None;
        } else if let Some(atomic) = allocator_call(insn, allocators) {
            since_call = Some((atomic, 0));
            last_size = held.constants.get(&Register::RDI).copied();
            call_sizes.insert(insn.ip(), last_size);
        } else if insn.flow_control() == FlowControl::Return {
            since_call = None;
        } else if let Some((_, n)) = &mut since_call {
            *n += 1;
            if *n > WINDOW {
                since_call = None;
            }
        }
        held.step(insn, allocator_call(insn, allocators), &|at| {
            read_only_word(exe, at)
        });
    });
    found
}

/// The ids stored but not named yet, named after the inlined `new` at
/// their `calls`: per id, the first name without a type parameter left
/// (`Array(T)` from the generic's own code) if a site gives one, else the first.
fn named_by_inlined_new(
    exe: &Module,
    calls: BTreeMap<u32, Vec<u64>>,
    stored: &BTreeMap<u32, u8>,
    names: &BTreeMap<u32, String>,
) -> BTreeMap<u32, String> {
    let unnamed: Vec<(u32, u64)> = calls
        .into_iter()
        .filter(|(id, _)| stored.contains_key(id) && !names.contains_key(id))
        .flat_map(|(id, at)| at.into_iter().map(move |a| (id, a)))
        .collect();
    let addresses: Vec<u64> = unnamed.iter().map(|&(_, at)| at).collect();
    let mut found: BTreeMap<u32, String> = BTreeMap::new();
    for ((id, _), owner) in unnamed.iter().zip(inlined_new_owners(exe, &addresses)) {
        let Some(owner) = owner else { continue };
        match found.get(id) {
            Some(old) if !has_parameter(old) || has_parameter(&owner) => {}
            _ => {
                found.insert(*id, owner);
            }
        }
    }
    found
}

/// Whether `insn` calls an allocator, and if so whether an atomic one.
fn allocator_call(insn: &Instruction, allocators: &HashMap<u64, bool>) -> Option<bool> {
    if insn.flow_control() != FlowControl::Call || !decode::is_direct_branch(insn) {
        return None;
    }
    allocators.get(&insn.near_branch_target()).copied()
}

/// The immediate of `movl $ID,(%reg)` / `movq $ID,(%reg)` (a register
/// other than the stack's): a type id's store.
fn stored_id(insn: &Instruction) -> Option<u32> {
    let stores = insn.mnemonic() == Mnemonic::Mov
        && matches!(insn.code(), Code::Mov_rm32_imm32 | Code::Mov_rm64_imm32)
        && insn.op0_kind() == OpKind::Memory
        && insn.memory_displacement64() == 0
        && insn.memory_index() == Register::None
        && !matches!(
            insn.memory_base(),
            Register::None | Register::RSP | Register::RBP | Register::RIP
        );
    stores.then(|| insn.immediate32())
}

/// The id a constructor at `address` stores after its first allocator
/// call, before any other: the object it allocates first is its own
/// (`initialize` runs after, and may allocate others). `None` when that
/// store is not a plain `mov $ID,(%reg)`.
fn constructed_id(
    exe: &Module,
    address: u64,
    size: u64,
    allocators: &HashMap<u64, bool>,
) -> Option<u32> {
    let code = exe.bytes_at(address)?;
    let len = if size > 0 { size as usize } else { MAX_CODE };
    let insns = decode::function(&code[..code.len().min(len).min(MAX_CODE)], address);
    let first = insns
        .iter()
        .position(|i| allocator_call(i, allocators).is_some())?;
    // Up to the next allocation: a store after that is another object's.
    insns[first + 1..]
        .iter()
        .take(WINDOW)
        .take_while(|i| {
            i.flow_control() != FlowControl::Return && allocator_call(i, allocators).is_none()
        })
        .find_map(stored_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(bytes: &[u8]) -> Option<u32> {
        stored_id(&decode::one(bytes, 0x1000))
    }

    #[test]
    fn only_a_constant_at_offset_0_of_a_register_is_a_type_id() {
        assert_eq!(id(&[0xc7, 0x01, 0xad, 0, 0, 0]), Some(0xad)); // movl $0xad,(%rcx)
        assert_eq!(id(&[0x48, 0xc7, 0x00, 0xad, 0, 0, 0]), Some(0xad)); // movq $0xad,(%rax)
        assert_eq!(id(&[0xc7, 0x41, 0x0c, 0, 0, 0, 0]), None); // movl $0,0xc(%rcx)
        assert_eq!(id(&[0xc7, 0x04, 0x24, 5, 0, 0, 0]), None); // movl $5,(%rsp)
        assert_eq!(id(&[0x89, 0x01]), None); // mov %eax,(%rcx)
    }

    /// Follows `code` (at 0x1000, with an allocator at 0x9000) with
    /// [`Held`]: the ids stored into a held object, and the allocator call
    /// each came from.
    fn held_stores(code: &[u8]) -> Vec<(u32, u64)> {
        let allocators = HashMap::from([(0x9000, false)]);
        let mut held = Held::default();
        let mut found = Vec::new();
        for insn in decode::function(code, 0x1000) {
            let id = stored_id(&insn).or_else(|| held.stored_constant(&insn));
            if let Some((call, _)) = id.and(held.get(insn.memory_base())) {
                found.push((id.unwrap(), call));
                held.forget(insn.memory_base());
            }
            held.step(&insn, allocator_call(&insn, &allocators), &|_| None);
        }
        found
    }

    #[test]
    fn an_id_stored_into_a_held_object_is_that_allocations() {
        let mut code = vec![0xe8]; // call 0x9000 (the allocator) at 0x1000
        code.extend((0x9000i32 - 0x1005).to_le_bytes());
        code.extend([0x49, 0x89, 0xc6]); // mov %rax,%r14
        code.push(0xe8); // call 0x9000 again (an initializer's object) at 0x1008
        code.extend((0x9000i32 - 0x100d).to_le_bytes());
        code.extend([0xc7, 0x00, 0x05, 0, 0, 0]); // movl $5,(%rax): the second object's
        code.extend([0x41, 0xc7, 0x06, 0xa1, 0, 0, 0]); // movl $0xa1,(%r14): the first's
        code.extend([0xb9, 0x07, 0, 0, 0]); // mov $7,%ecx
        code.extend([0x41, 0x89, 0x0e]); // mov %ecx,(%r14): already typed, not an id
        assert_eq!(held_stores(&code), vec![(5, 0x1008), (0xa1, 0x1000)]);
        // A call that is not an allocator's clobbers rax, not r14.
        let mut code = vec![0xe8];
        code.extend((0x9000i32 - 0x1005).to_le_bytes());
        code.extend([0x49, 0x89, 0xc6]); // mov %rax,%r14
        code.push(0xe8); // call 0x7000
        code.extend((0x7000i32 - 0x100d).to_le_bytes());
        code.extend([0xc7, 0x00, 0x05, 0, 0, 0]); // movl $5,(%rax): not held
        code.extend([0xb9, 0xa2, 0, 0, 0]); // mov $0xa2,%ecx
        code.extend([0x41, 0x89, 0x0e]); // mov %ecx,(%r14)
        assert_eq!(held_stores(&code), vec![(0xa2, 0x1000)]);
    }

    #[test]
    fn a_constant_in_a_callee_saved_register_outlives_the_allocator_call() {
        // As a release build's loop allocates Widgets (the compiler's `new`):
        let mut code = vec![0x49, 0xbf]; // movabs $0x1000000af,%r15
        code.extend(0x1_0000_00afu64.to_le_bytes());
        code.extend([0xbb, 0x07, 0, 0, 0]); // mov $7,%ebx
        code.extend([0xb9, 0x09, 0, 0, 0]); // mov $9,%ecx
        code.push(0xe8); // call 0x9000 (the allocator) at 0x1014
        code.extend((0x9000i32 - 0x1019).to_le_bytes());
        code.extend([0x4c, 0x89, 0x38]); // mov %r15,(%rax): Widget's id
        assert_eq!(held_stores(&code), vec![(0xaf, 0x1014)]);
        // rcx is the caller's to save: its constant is gone after a call.
        let mut code = vec![0xb9, 0x09, 0, 0, 0]; // mov $9,%ecx
        code.push(0xe8); // call 0x9000 at 0x1005
        code.extend((0x9000i32 - 0x100a).to_le_bytes());
        code.extend([0x48, 0x89, 0x08]); // mov %rcx,(%rax)
        assert_eq!(held_stores(&code), vec![]);
    }

    #[test]
    fn a_word_stored_only_in_the_other_kind_of_memory_is_no_type_id() {
        let names = TypeNames {
            names: BTreeMap::from([(173, "Author".to_string())]),
            stored: BTreeMap::from([(173, ATOMIC), (174, NORMAL), (200, NORMAL | ATOMIC)]),
            sizes: BTreeMap::new(),
        };
        assert_eq!(names.type_of(173, true), TypeOf::Named("Author"));
        assert_eq!(names.type_of(173, false), TypeOf::NotAType);
        assert_eq!(names.type_of(174, false), TypeOf::Unnamed);
        assert_eq!(names.type_of(180, true), TypeOf::Unnamed);
        assert_eq!(names.type_of(201, false), TypeOf::NotAType);
        assert_eq!(names.type_of(0, false), TypeOf::NotAType);
    }

    /// A census knows an object's size class, not its request: a class of
    /// known size is believed in any class the collector rounds it up to,
    /// not in a buffer many times its size whose data starts with its id.
    #[test]
    fn a_word_in_an_object_far_bigger_than_its_class_is_no_type_id() {
        let names = TypeNames {
            names: BTreeMap::from([(175, "Widget".to_string()), (176, "Buffer".to_string())]),
            stored: BTreeMap::from([(175, ATOMIC), (176, ATOMIC)]),
            sizes: BTreeMap::from([(175, vec![8]), (176, vec![1400])]),
        };
        assert_eq!(names.type_of_given(175, true, 16), TypeOf::Named("Widget"));
        assert_eq!(names.type_of_given(175, true, 8208), TypeOf::NotAType);
        assert_eq!(names.type_of_given(175, true, 0), TypeOf::NotAType);
        // Two 1,400-byte objects per 4-KiB block: each is given 2,048.
        assert_eq!(
            names.type_of_given(176, true, 2048),
            TypeOf::Named("Buffer")
        );
        // An id of unknown sizes is judged by its kind alone.
        assert_eq!(names.type_of_given(170, true, 8208), TypeOf::Unnamed);
    }

    /// A debug build's `Widget.new` sizes its allocation in `%rdi` from a
    /// zeroed register: the size is known (8), as `mov $8,%edi`'s is.
    #[test]
    fn a_debug_builds_computed_size_is_a_constant() {
        let code = [
            0x31, 0xc0, // xor %eax,%eax
            0x89, 0xc7, // mov %eax,%edi
            0x48, 0x83, 0xc7, 0x08, // add $0x8,%rdi
        ];
        let mut held = Held::default();
        for insn in decode::function(&code, 0x1000) {
            held.step(&insn, None, &|_| None);
        }
        assert_eq!(held.constants.get(&Register::RDI), Some(&8));
        // Any other write forgets it.
        let code = [0x48, 0x83, 0xc7, 0x08, 0x48, 0x01, 0xf7]; // add $8,%rdi; add %rsi,%rdi
        let mut held = Held::default();
        held.constants.insert(Register::RDI, 0);
        for insn in decode::function(&code, 0x1000) {
            held.step(&insn, None, &|_| None);
        }
        assert_eq!(held.constants.get(&Register::RDI), None);
    }
}
