//! A target's file shrinking while memprof reads it.
//!
//! memprof (and blazesym) read ELF files through read-only mappings. A user
//! who truncates their own file while it is read would make the next read
//! of a page past the new end raise SIGBUS, which ends a process. Instead,
//! memprof's handler puts a page of zeros where the file's page was (the
//! read resumes and sees zeros, which the parsers reject or read as
//! nothing) and records the page, so that the file's module is then
//! refused ([`shrank_within`] since its [`mark`]): an error for that
//! file, not for memprof.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;

/// Pages replaced so far (the first [`KEPT`] of them are remembered).
static REPLACED: AtomicUsize = AtomicUsize::new(0);
const KEPT: usize = 64;
static PAGES: [AtomicUsize; KEPT] = [const { AtomicUsize::new(0) }; KEPT];
const PAGE: usize = 4096;

/// Installs the handler (once per process).
pub fn handle_sigbus() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: a handler that only makes async-signal-safe calls
        // (mmap, sigaction, raise) and atomic stores.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigbus as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
        }
    });
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel's siginfo for this SIGBUS.
    let (code, address) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    if code == libc::BUS_ADRERR && address != 0 {
        let page = address & !(PAGE - 1);
        // SAFETY: replaces one page of a mapping whose file no longer
        // covers it (the access faulted) with zeros, read-only.
        let mapped = unsafe {
            libc::mmap(
                page as *mut libc::c_void,
                PAGE,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if mapped != libc::MAP_FAILED {
            let n = REPLACED.fetch_add(1, Ordering::SeqCst);
            if n < KEPT {
                PAGES[n].store(page, Ordering::SeqCst);
            }
            return;
        }
    }
    // Any other bus error ends memprof as it would have without a handler.
    // SAFETY: async-signal-safe calls.
    unsafe {
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
        libc::raise(libc::SIGBUS);
    }
}

/// Where the record of replaced pages stands: taken right after a file is
/// mapped, so that [`shrank_within`] looks only at pages replaced since
/// (an earlier mapping at the same addresses, unmapped since, is not this
/// file's).
pub fn mark() -> usize {
    REPLACED.load(Ordering::SeqCst)
}

/// Whether a page of `data` (a mapping of a file, made before `since` was
/// [`mark`]ed) was replaced since because the file shrank while read (or
/// too many pages were to tell).
pub fn shrank_within(data: &[u8], since: usize) -> bool {
    let n = REPLACED.load(Ordering::SeqCst);
    if n > KEPT {
        return n > since;
    }
    let range = data.as_ptr() as usize..data.as_ptr() as usize + data.len();
    PAGES[since.min(n)..n]
        .iter()
        .any(|p| range.contains(&p.load(Ordering::SeqCst)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_file_truncated_under_its_mapping_reads_zeros_and_is_known() {
        handle_sigbus();
        let path = std::env::temp_dir().join(format!("memprof-shrunk-{}", std::process::id()));
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&vec![7u8; 4 * PAGE]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: read-only; the test truncates it on purpose.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let since = mark();
        assert_eq!(map[3 * PAGE], 7);
        assert!(!shrank_within(&map, since));
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(PAGE as u64)
            .unwrap();
        assert_eq!(map[0], 7);
        // Past the new end: zeros, no SIGBUS.
        assert_eq!(std::hint::black_box(map[2 * PAGE + 5]), 0);
        assert!(shrank_within(&map, since));
        // A later mapping, at the same addresses or not, starts clean.
        drop(map);
        let again = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        assert!(!shrank_within(&again, mark()));
        std::fs::remove_file(&path).unwrap();
    }
}
