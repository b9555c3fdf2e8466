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
//! its callers: those ids stay unnamed (`(type 123)` in reports).
use std::collections::{BTreeMap, HashSet};

use iced_x86::{Code, FlowControl, Mnemonic, OpKind, Register};

use super::parse_method;
use crate::modules::Module;
use crate::x86::decode;

/// The functions a constructor allocates with.
const ALLOCATORS: &[&str] = &[
    "__crystal_malloc64",
    "__crystal_malloc_atomic64",
    "__crystal_malloc",
    "__crystal_malloc_atomic",
    "GC_malloc",
    "GC_malloc_atomic",
];

/// Instructions looked at after an allocator call for the id's store.
const WINDOW: usize = 40;

/// Longest constructor decoded (its symbol size, when it has one).
const MAX_CODE: usize = 16 << 10;

/// Crystal type ids and the classes they name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TypeNames {
    pub names: BTreeMap<u32, String>,
}

impl TypeNames {
    pub fn name(&self, id: u32) -> Option<&str> {
        self.names.get(&id).map(String::as_str)
    }
}

/// The type ids the constructors of `exe` store, named after their class.
pub fn type_names(exe: &Module) -> TypeNames {
    let mut allocators: HashSet<u64> = ALLOCATORS
        .iter()
        .filter_map(|name| exe.symbol(name).map(|s| s.address))
        .collect();
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
                allocators.insert(address);
            }
            Some(owner) if m.class_method && (m.name == "new" || m.name == "allocate") => {
                constructors.push((owner.to_string(), address, size));
            }
            _ => {}
        }
    }
    let mut names = BTreeMap::new();
    // Sorted, so that an id two constructors claim gets the same name every run.
    constructors.sort();
    for (owner, address, size) in constructors {
        for id in stored_ids(exe, address, size, &allocators) {
            names.entry(id).or_insert_with(|| owner.clone());
        }
    }
    if let Some(sym) = exe.symbol("String::TYPE_ID") {
        if let Some(bytes) = exe
            .bytes_at(sym.address)
            .filter(|_| exe.is_read_only(sym.address))
            .and_then(|b| b.get(..4))
        {
            names.insert(
                u32::from_le_bytes(bytes.try_into().unwrap()),
                "String".into(),
            );
        }
    }
    TypeNames { names }
}

/// The 32-bit immediates the function at `address` stores at offset 0 of
/// a register first after each call to one of `allocators`.
fn stored_ids(exe: &Module, address: u64, size: u64, allocators: &HashSet<u64>) -> Vec<u32> {
    let Some(code) = exe.bytes_at(address) else {
        return Vec::new();
    };
    let len = if size > 0 { size as usize } else { MAX_CODE };
    let insns = decode::function(&code[..code.len().min(len).min(MAX_CODE)], address);
    let mut ids = Vec::new();
    for (i, insn) in insns.iter().enumerate() {
        let calls_allocator = insn.flow_control() == FlowControl::Call
            && decode::is_direct_branch(insn)
            && allocators.contains(&insn.near_branch_target());
        if !calls_allocator {
            continue;
        }
        for next in insns.iter().skip(i + 1).take(WINDOW) {
            if next.flow_control() == FlowControl::Return {
                break;
            }
            let stores_id = next.mnemonic() == Mnemonic::Mov
                && next.code() == Code::Mov_rm32_imm32
                && next.op0_kind() == OpKind::Memory
                && next.memory_displacement64() == 0
                && next.memory_index() == Register::None
                && !matches!(
                    next.memory_base(),
                    Register::None | Register::RSP | Register::RBP | Register::RIP
                );
            if stores_id {
                ids.push(next.immediate32());
                break;
            }
        }
    }
    ids
}
