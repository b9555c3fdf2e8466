//! Reading the process's memory while it runs (`process_vm_readv`: no
//! ptrace stop, the kernel checks the range).
use std::io;

/// Reads `buf.len()` bytes at `addr` of process `pid` (`process_vm_readv`).
pub fn vm_read(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let local = libc::iovec {
            iov_base: buf[done..].as_mut_ptr().cast(),
            iov_len: buf.len() - done,
        };
        let remote = libc::iovec {
            iov_base: (addr + done as u64) as *mut libc::c_void,
            iov_len: buf.len() - done,
        };
        // SAFETY: `local` is our own writable buffer of that length; the
        // kernel checks the remote range.
        let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
        if n <= 0 {
            return Err(if n == 0 {
                io::Error::from(io::ErrorKind::UnexpectedEof)
            } else {
                io::Error::last_os_error()
            });
        }
        done += n as usize;
    }
    Ok(())
}
