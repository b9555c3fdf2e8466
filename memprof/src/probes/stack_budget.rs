//! The eBPF programs' stack, counted as the kernel's verifier counts it.
//!
//! A kernel without private BPF stacks (every kernel before 6.13, and later
//! builds that give uprobe programs none) allows 512 bytes of stack for a
//! whole bpf-to-bpf call chain, not for each function: the verifier walks
//! every call path of a program, adds up the frames, and refuses to load
//! the program ("combined stack size of N calls is M. Too large") when a
//! path goes over. The compiler knows nothing of this: a helper inlined
//! into a program, or one more local in a subprogram, can push a chain
//! over, and the probes then stop loading on older kernels only.
//!
//! So this test reads the object embedded in memprof, works out each
//! program's worst chain the way the verifier does, and fails naming the
//! chains over the budget. With `--nocapture` it prints every program's
//! worst chain, which shows where a program's stack goes.
//!
//! The rules, as the verifier has them:
//! - a function's depth is the deepest `r10 - N` it touches: a load or
//!   store through `r10` (or a register holding `r10 + k`), or a stack
//!   slot's address taken (`r1 = r10; r1 += -N`) to hand to a helper or a
//!   callee;
//! - its frame is that depth rounded up ([`frame`]);
//! - a program's chains follow the bpf-to-bpf calls (a call with
//!   `src_reg` 1, `BPF_PSEUDO_CALL`), and the functions whose address is
//!   loaded for a helper to call back (`bpf_loop`'s callback: the verifier
//!   counts it as called there); helper calls (`src_reg` 0) and kfunc
//!   calls (`src_reg` 2) are not.
//!
//! The analysis ([`chains`]) is a pure function of the object's code
//! sections, function symbols and relocations, so the tests at the end can
//! feed it a few instructions assembled by hand.
use std::collections::{HashMap, HashSet};
use std::fmt;

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget, SectionKind, SymbolKind};

/// The verifier's budget for a whole call chain (`MAX_BPF_STACK`).
const BUDGET: u32 = 512;

/// A function's frame as the verifier adds it to a chain: its depth
/// rounded up to 32 bytes, and 32 for a function that uses no stack.
///
/// That is 6.1's rule, `round_up(max_t(u32, stack_depth, 1), 32)` in
/// `check_max_stack_depth` ("32 bytes, since this is granularity of
/// interpreter stack size"), and still the rule for interpreted programs.
/// Since 6.9 (`round_up_stack_depth`), a JIT-ed program's frames round to
/// 16 instead, and an empty one counts 0: 6.1 is the oldest kernel memprof
/// supports, and the stricter.
fn frame(depth: u32) -> u32 {
    depth.max(1).next_multiple_of(32)
}

/// A section of code: the programs' (`uprobe`, `raw_tp/...`: every
/// section but `.text`) or the subprograms' (`.text`).
struct Section<'a> {
    name: &'a str,
    code: &'a [u8],
}

/// A function symbol (`STT_FUNC`): in which section (an index into the
/// sections), from which byte, how many bytes.
struct Function<'a> {
    name: &'a str,
    section: usize,
    start: usize,
    size: usize,
}

/// A relocation at an instruction of code that names a place in code: a
/// call to a function of another section (`R_BPF_64_32`), or a function's
/// address loaded for a helper to call (`R_BPF_64_64` at an `lddw`).
struct Relocation {
    section: usize,
    offset: usize,
    target: Target,
}

/// What a relocation names.
enum Target {
    /// A symbol of a function: the place it starts.
    Function { section: usize, start: usize },
    /// A section's symbol: the instruction's immediate says where in it
    /// (for a call `(imm + 1) * 8` bytes, for an `lddw` `imm` bytes).
    Section(usize),
}

/// A program's worst chain: the program, then each function it calls
/// down to the deepest, each with its frame.
struct Chain<'a> {
    frames: Vec<(&'a str, u32)>,
}

impl Chain<'_> {
    fn program(&self) -> &str {
        self.frames[0].0
    }

    fn total(&self) -> u32 {
        self.frames.iter().map(|&(_, frame)| frame).sum()
    }
}

/// `prog (N) > callee (M) > ... = T bytes`, with Rust names demangled
/// (`host::build_table`, not `_RNvNtCs..._14memprof_probes4host11build_table`).
impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, frame)) in self.frames.iter().enumerate() {
            let name = format!("{:#}", rustc_demangle::demangle(name));
            let name = name.strip_prefix("memprof_probes::").unwrap_or(&name);
            let separator = if i == 0 { "" } else { " > " };
            write!(f, "{separator}{name} ({frame})")?;
        }
        write!(f, " = {} bytes", self.total())
    }
}

/// One 8-byte BPF instruction, little-endian as `bpfel` objects are
/// (`lddw` takes two: its second holds the upper half of the immediate).
struct Insn {
    code: u8,
    dst: usize,
    src: usize,
    off: i16,
    imm: i32,
}

impl Insn {
    fn decode(bytes: &[u8]) -> Insn {
        Insn {
            code: bytes[0],
            dst: usize::from(bytes[1] & 0xf),
            src: usize::from(bytes[1] >> 4),
            off: i16::from_le_bytes([bytes[2], bytes[3]]),
            imm: i32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]),
        }
    }
}

// Instruction classes (`code & 7`), modes (`code & 0xe0`) and the codes
// this reads.
const LD: u8 = 0;
const LDX: u8 = 1;
const ST: u8 = 2;
const STX: u8 = 3;
const ALU: u8 = 4;
const JMP: u8 = 5;
const JMP32: u8 = 6;
const ALU64: u8 = 7;
const MEM: u8 = 0x60;
const MEMSX: u8 = 0x80;
const ATOMIC: u8 = 0xc0;
const LDDW: u8 = 0x18;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const JA32: u8 = 0x06;
const MOV64_REG: u8 = 0xbf;
const ADD64_IMM: u8 = 0x07;
const SUB64_IMM: u8 = 0x17;
/// The frame pointer.
const R10: usize = 10;
/// `src_reg` of a call: a bpf-to-bpf call (0 is a helper, 2 a kfunc).
const PSEUDO_CALL: usize = 1;
/// `src_reg` of an `lddw`: a function's address, pc-relative.
const PSEUDO_FUNC: usize = 4;

/// Where a jump goes, as an instruction index.
fn jump_target(insn: &Insn, index: usize) -> Option<usize> {
    let (class, op) = (insn.code & 7, insn.code & 0xf0);
    if !(class == JMP || class == JMP32) || op == CALL & 0xf0 || op == EXIT & 0xf0 {
        return None;
    }
    // `gotol` (JMP32 | JA) jumps by its immediate; the others by `off`.
    let by = if insn.code == JA32 {
        insn.imm as isize
    } else {
        insn.off as isize
    };
    index.checked_add_signed(by + 1)
}

/// The instructions of `code[start..end]`, each with its byte offset.
fn instructions(code: &[u8], start: usize, end: usize) -> impl Iterator<Item = (usize, Insn)> + '_ {
    let mut pc = start;
    std::iter::from_fn(move || {
        let insn = Insn::decode(code.get(pc..(pc + 8).min(end))?.get(..8)?);
        let at = pc;
        pc += if insn.code == LDDW { 16 } else { 8 };
        Some((at, insn))
    })
}

/// One function's code read: its depth, and the places in code it calls
/// (or hands a helper to call), as (section, byte offset).
struct Scan {
    depth: u32,
    callees: Vec<(usize, usize)>,
}

/// Reads `function`'s instructions, in `code`, the section `section`'s;
/// `relocations` are that section's, by offset.
fn scan(
    section: usize,
    code: &[u8],
    function: &Function,
    relocations: &HashMap<usize, &Target>,
) -> Scan {
    let end = function.start + function.size;
    // Jump targets: where what a register holds is no longer known.
    let joins: HashSet<usize> = instructions(code, function.start, end)
        .filter_map(|(at, insn)| jump_target(&insn, at / 8))
        .collect();
    // The place `by` instructions past the next one, in this section: the
    // target of a call, or of a `BPF_PSEUDO_FUNC` address, by offset.
    let relative =
        |index: usize, by: i32| (section, (index as i64 + i64::from(by) + 1) as usize * 8);

    // For each register, `Some(k)` while it holds `r10 + k`.
    let mut stack = [None::<i64>; 16];
    let mut depth = 0i64;
    let mut callees = Vec::new();
    for (at, insn) in instructions(code, function.start, end) {
        let index = at / 8;
        if joins.contains(&index) {
            stack = [None; 16];
        }
        stack[R10] = Some(0);
        let mode = insn.code & 0xe0;
        let off = i64::from(insn.off);
        // The slot an access through `base + off` touches, if on the stack.
        let slot = |base: usize| stack[base].map(|k| k + off);
        let touched = match insn.code & 7 {
            LDX if mode == MEM || mode == MEMSX => slot(insn.src),
            ST | STX if mode == MEM || mode == ATOMIC => slot(insn.dst),
            _ => None,
        };
        match insn.code & 7 {
            LDX => stack[insn.dst] = None,
            // A fetch writes its source register, a compare-exchange r0.
            STX if mode == ATOMIC => (stack[insn.src], stack[0]) = (None, None),
            ALU64 if insn.code == MOV64_REG && insn.off == 0 => stack[insn.dst] = stack[insn.src],
            ALU64 if insn.code == ADD64_IMM => {
                stack[insn.dst] = stack[insn.dst].map(|k| k + i64::from(insn.imm))
            }
            ALU64 if insn.code == SUB64_IMM => {
                stack[insn.dst] = stack[insn.dst].map(|k| k - i64::from(insn.imm))
            }
            ALU | ALU64 | LD => stack[insn.dst] = None,
            _ => {}
        }
        // An address taken: `r1 = r10; r1 += -N`.
        let address = match insn.code {
            ADD64_IMM | SUB64_IMM => stack[insn.dst],
            _ => None,
        };
        for k in touched.into_iter().chain(address) {
            depth = depth.max(-k);
        }

        if insn.code == CALL {
            if insn.src == PSEUDO_CALL {
                callees.push(match relocations.get(&at) {
                    Some(Target::Function { section, start }) => (*section, *start),
                    Some(Target::Section(section)) => {
                        (*section, (insn.imm as isize + 1) as usize * 8)
                    }
                    None => relative(index, insn.imm),
                });
            }
            // r0 to r5 do not survive a call.
            stack[..6].fill(None);
        }
        if insn.code == LDDW {
            // A function's address: named by a relocation in an object
            // not yet loaded, pc-relative (`BPF_PSEUDO_FUNC`) once it is.
            callees.extend(match relocations.get(&at) {
                Some(Target::Function { section, start }) => Some((*section, *start)),
                Some(Target::Section(section)) => Some((*section, insn.imm as usize)),
                None if insn.src == PSEUDO_FUNC => Some(relative(index, insn.imm)),
                None => None,
            });
        }
    }
    Scan {
        depth: u32::try_from(depth).unwrap_or(u32::MAX),
        callees,
    }
}

/// Each program's worst chain, in the order of the programs' names: the
/// programs are the functions of every section but `.text`.
fn chains<'a>(
    sections: &[Section<'a>],
    functions: &[Function<'a>],
    relocations: &[Relocation],
) -> Result<Vec<Chain<'a>>, String> {
    let starts: HashMap<(usize, usize), usize> = functions
        .iter()
        .enumerate()
        .map(|(i, f)| ((f.section, f.start), i))
        .collect();
    let mut frames = Vec::new();
    let mut calls = Vec::new();
    for function in functions {
        let section = &sections[function.section];
        let relocations = relocations
            .iter()
            .filter(|r| r.section == function.section)
            .map(|r| (r.offset, &r.target))
            .collect();
        let scan = scan(function.section, section.code, function, &relocations);
        frames.push(frame(scan.depth));
        let callees = scan.callees.iter().map(|place| {
            starts.get(place).copied().ok_or_else(|| {
                let (in_section, at) = place;
                format!(
                    "{} calls {}+{at:#x}, where no function starts",
                    function.name, sections[*in_section].name
                )
            })
        });
        calls.push(callees.collect::<Result<Vec<_>, _>>()?);
    }

    // The worst chain from each function, as the functions along it.
    fn worst(
        f: usize,
        frames: &[u32],
        calls: &[Vec<usize>],
        memo: &mut HashMap<usize, (u32, Vec<usize>)>,
        path: &mut Vec<usize>,
    ) -> (u32, Vec<usize>) {
        if let Some(known) = memo.get(&f) {
            return known.clone();
        }
        path.push(f);
        let mut deepest = (0, Vec::new());
        for &callee in &calls[f] {
            // BPF has no recursion (the verifier refuses it); a cycle
            // here would only make the walk endless.
            if !path.contains(&callee) {
                deepest = deepest.max(worst(callee, frames, calls, memo, path));
            }
        }
        path.pop();
        let (below, mut chain) = deepest;
        chain.insert(0, f);
        let result = (frames[f] + below, chain);
        memo.insert(f, result.clone());
        result
    }

    let mut memo = HashMap::new();
    let mut programs: Vec<usize> = (0..functions.len())
        .filter(|&f| sections[functions[f].section].name != ".text")
        .collect();
    programs.sort_by_key(|&f| functions[f].name);
    Ok(programs
        .into_iter()
        .map(|program| {
            let (_, chain) = worst(program, &frames, &calls, &mut memo, &mut Vec::new());
            Chain {
                frames: chain
                    .into_iter()
                    .map(|f| (functions[f].name, frames[f]))
                    .collect(),
            }
        })
        .collect())
}

/// Each program's worst chain in an eBPF object (ELF, relocatable).
fn object_chains(data: &[u8]) -> Result<Vec<Chain<'_>>, String> {
    let elf = object::File::parse(data).map_err(|e| e.to_string())?;
    let code: Vec<_> = elf
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .collect();
    let ours = |index| code.iter().position(|s| s.index() == index);
    let sections = code
        .iter()
        .map(|s| {
            Ok(Section {
                name: s.name()?,
                code: s.data()?,
            })
        })
        .collect::<object::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    let mut functions = Vec::new();
    for symbol in elf.symbols().filter(|s| s.kind() == SymbolKind::Text) {
        if let Some(section) = symbol.section_index().and_then(ours) {
            functions.push(Function {
                name: symbol.name().map_err(|e| e.to_string())?,
                section,
                start: symbol.address() as usize,
                size: symbol.size() as usize,
            });
        }
    }
    let mut relocations = Vec::new();
    for (section, s) in code.iter().enumerate() {
        for (offset, relocation) in s.relocations() {
            let RelocationTarget::Symbol(index) = relocation.target() else {
                continue;
            };
            let symbol = elf.symbol_by_index(index).map_err(|e| e.to_string())?;
            // Only relocations naming code: not those of maps.
            let Some(in_section) = symbol.section_index().and_then(ours) else {
                continue;
            };
            let target = if symbol.kind() == SymbolKind::Section {
                Target::Section(in_section)
            } else {
                Target::Function {
                    section: in_section,
                    start: symbol.address() as usize,
                }
            };
            relocations.push(Relocation {
                section,
                offset: offset as usize,
                target,
            });
        }
    }
    chains(&sections, &functions, &relocations)
}

#[test]
fn every_program_fits_the_stack_of_kernels_without_private_stacks() {
    let chains = object_chains(super::OBJECT).unwrap();
    assert!(!chains.is_empty(), "no programs in the object");
    for chain in &chains {
        println!("{chain}");
    }
    let over: Vec<String> = chains
        .iter()
        .filter(|chain| chain.total() > BUDGET)
        .map(|chain| format!("  {}: {chain}", chain.program()))
        .collect();
    assert!(
        over.is_empty(),
        "programs whose stack goes over {BUDGET} bytes along a call chain: kernels without \
         private BPF stacks (before 6.13) refuse them (\"combined stack size of N calls is M. \
         Too large\"):\n{}",
        over.join("\n")
    );
}

/// Instructions assembled by hand, and the analysis's rules on them.
mod rules {
    use super::*;

    fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Vec<u8> {
        let mut bytes = vec![code, src << 4 | dst];
        bytes.extend(off.to_le_bytes());
        bytes.extend(imm.to_le_bytes());
        bytes
    }

    /// `*(u64 *)(r10 - n) = r1`
    fn store_below_fp(n: i16) -> Vec<u8> {
        insn(0x7b, 10, 1, -n, 0)
    }

    /// `r1 = r10; r1 += -n`: a stack slot's address, for a helper.
    fn address_below_fp(n: i32) -> Vec<u8> {
        [insn(MOV64_REG, 1, 10, 0, 0), insn(ADD64_IMM, 1, 0, 0, -n)].concat()
    }

    fn call(src: u8, imm: i32) -> Vec<u8> {
        insn(CALL, 0, src, 0, imm)
    }

    /// `r{dst} = imm ll`, two slots.
    fn lddw(dst: u8, src: u8, imm: i32) -> Vec<u8> {
        [insn(LDDW, dst, src, 0, imm), insn(0, 0, 0, 0, 0)].concat()
    }

    fn exit() -> Vec<u8> {
        insn(EXIT, 0, 0, 0, 0)
    }

    /// The functions of one section, each its instructions, laid end to
    /// end.
    fn functions<'a>(
        section: usize,
        bodies: &[(&'a str, Vec<u8>)],
    ) -> (Vec<u8>, Vec<Function<'a>>) {
        let mut code = Vec::new();
        let mut functions = Vec::new();
        for (name, body) in bodies {
            functions.push(Function {
                name,
                section,
                start: code.len(),
                size: body.len(),
            });
            code.extend(body);
        }
        (code, functions)
    }

    /// Section 0 `uprobe` holds the programs, section 1 `.text` the
    /// subprograms; the chains, as text.
    fn analyze(
        programs: &[(&str, Vec<u8>)],
        text: &[(&str, Vec<u8>)],
        relocations: &[Relocation],
    ) -> Vec<String> {
        let (program_code, mut all) = functions(0, programs);
        let (text_code, subprograms) = functions(1, text);
        all.extend(subprograms);
        let sections = [
            Section {
                name: "uprobe",
                code: &program_code,
            },
            Section {
                name: ".text",
                code: &text_code,
            },
        ];
        let chains = chains(&sections, &all, relocations).unwrap();
        chains.iter().map(|chain| chain.to_string()).collect()
    }

    #[test]
    fn two_frames_over_the_budget_between_them() {
        // 400 bytes of stack in the program, 200 in the function it calls
        // (by name: a relocation at the call), each within the budget; a
        // helper call does not count. (Rounded to 16, 6.9's rule for a
        // JIT, this would be 400 + 208 = 608: over too.)
        let program = [store_below_fp(400), call(1, -1), exit()].concat();
        let callee = [address_below_fp(200), call(0, 14), exit()].concat();
        let to_callee = Relocation {
            section: 0,
            offset: 8,
            target: Target::Function {
                section: 1,
                start: 0,
            },
        };
        let chains = analyze(&[("big", program)], &[("small", callee)], &[to_callee]);
        assert_eq!(chains, ["big (416) > small (224) = 640 bytes"]);
    }

    #[test]
    fn helper_and_kfunc_calls_are_not_bpf_to_bpf() {
        let program = [store_below_fp(8), call(0, 1), call(2, 1234), exit()].concat();
        // Were either taken for a bpf-to-bpf call, its target (by offset)
        // would be no function's start, and the analysis would fail.
        assert_eq!(
            analyze(&[("p", program)], &[("f", exit())], &[]),
            ["p (32) = 32 bytes"]
        );
    }

    #[test]
    fn calls_in_a_section_are_pc_relative_and_lddw_takes_two_slots() {
        // The program calls `outer` through .text's section symbol, 8 bytes
        // in; `outer` calls `inner` by offset: lddw at 1 and 2, the call at
        // 3, the exit at 4, `inner` at 5: 3 + 1 + 1.
        let program = [call(1, 0), exit()].concat();
        let outer = [lddw(1, 0, 7), call(1, 1), exit()].concat();
        let inner = [store_below_fp(40), exit()].concat();
        let into_text = Relocation {
            section: 0,
            offset: 0,
            target: Target::Section(1),
        };
        let chains = analyze(
            &[("p", program)],
            &[("first", exit()), ("outer", outer), ("inner", inner)],
            &[into_text],
        );
        // A function without stack counts 32 (6.1's rounding).
        assert_eq!(chains, ["p (32) > outer (32) > inner (64) = 128 bytes"]);
    }

    #[test]
    fn a_callback_counts_as_called_where_its_address_is_taken() {
        // `bpf_loop(8, callback, 0, 0)`: the callback's address is .text's
        // symbol plus 8 bytes.
        let program = [insn(0xb7, 1, 0, 0, 8), lddw(2, 0, 8), call(0, 181), exit()].concat();
        let callback = [store_below_fp(300), exit()].concat();
        let address = Relocation {
            section: 0,
            offset: 8,
            target: Target::Section(1),
        };
        let chains = analyze(
            &[("p", program)],
            &[("first", exit()), ("callback", callback)],
            &[address],
        );
        assert_eq!(chains, ["p (32) > callback (320) = 352 bytes"]);
    }

    #[test]
    fn the_deepest_branch_is_the_chain_and_the_walk_ends_on_cycles() {
        // p calls a (small) and b (large), both by name; b calls c, and c
        // calls b back (by offset): the walk does not follow that edge.
        let program = [call(1, -1), call(1, -1), exit()].concat();
        let a = [store_below_fp(16), exit()].concat();
        let b = [store_below_fp(100), call(1, 1), exit()].concat();
        let c = [call(1, -4), exit()].concat();
        let to = |offset, start| Relocation {
            section: 0,
            offset,
            target: Target::Function { section: 1, start },
        };
        let chains = analyze(
            &[("p", program)],
            &[("a", a), ("b", b), ("c", c)],
            &[to(0, 0), to(8, 16)],
        );
        assert_eq!(chains, ["p (32) > b (128) > c (32) = 192 bytes"]);
    }
}
