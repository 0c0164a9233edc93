//! The generation of the network namespace's nftables ruleset, asked of the kernel over netlink.
//!
//! The kernel counts one up for every transaction it commits, whoever sends it, and for nothing
//! else (the clients that traffic adds to a dynamic set do not count). So an unchanged generation
//! means nobody changed any table since it was read, which a listing of the table would cost far
//! more to find out. The request is one `NFT_MSG_GETGEN` message, answered by one
//! `NFT_MSG_NEWGEN` carrying `NFTA_GEN_ID` (`linux/netfilter/nf_tables.h`).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_MSG_NEWGEN: u16 = 15;
const NFT_MSG_GETGEN: u16 = 16;
const NFTA_GEN_ID: u16 = 1;
/// `struct nlmsghdr` then `struct nfgenmsg`.
const HEADER: usize = 16 + 4;

/// The ruleset's generation now; `None` when the kernel cannot be asked (no nf_tables, no
/// permission), which callers take as "may have changed".
pub(crate) fn current() -> Option<u32> {
    // SAFETY: socket has no memory preconditions; the descriptor it returns is owned below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_NETFILTER) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // An answer is immediate; never let a kernel that does not answer hold the proxy up.
    let timeout = libc::timeval { tv_sec: 1, tv_usec: 0 };
    // SAFETY: setsockopt reads one timeval, which `timeout` is, of the size given.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    let mut request = [0u8; HEADER];
    request[0..4].copy_from_slice(&(HEADER as u32).to_ne_bytes());
    request[4..6].copy_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN).to_ne_bytes());
    request[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    request[8..12].copy_from_slice(&1u32.to_ne_bytes());
    // nfgenmsg: AF_UNSPEC, NFNETLINK_V0, resource id 0: all zero.
    // SAFETY: send reads `request.len()` bytes of `request`.
    let sent = unsafe { libc::send(fd.as_raw_fd(), request.as_ptr().cast(), request.len(), 0) };
    if sent != request.len() as isize {
        return None;
    }
    let mut answer = [0u8; 512];
    // SAFETY: recv writes at most `answer.len()` bytes into `answer`.
    let got = unsafe { libc::recv(fd.as_raw_fd(), answer.as_mut_ptr().cast(), answer.len(), 0) };
    parse(answer.get(..usize::try_from(got).ok()?)?)
}

/// The generation in a `NFT_MSG_NEWGEN` answer.
fn parse(msg: &[u8]) -> Option<u32> {
    let kind = u16::from_ne_bytes(msg.get(4..6)?.try_into().ok()?);
    if kind != (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN {
        return None;
    }
    let len = usize::try_from(u32::from_ne_bytes(msg.get(0..4)?.try_into().ok()?)).ok()?;
    let mut attrs = msg.get(HEADER..len.min(msg.len()))?;
    while attrs.len() >= 4 {
        let alen = usize::from(u16::from_ne_bytes(attrs[0..2].try_into().ok()?));
        let atype = u16::from_ne_bytes(attrs[2..4].try_into().ok()?) & 0x3fff;
        if alen < 4 {
            return None;
        }
        if atype == NFTA_GEN_ID && alen == 8 {
            return Some(u32::from_be_bytes(attrs.get(4..8)?.try_into().ok()?));
        }
        attrs = attrs.get(alen.next_multiple_of(4)..).unwrap_or_default();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_gives_its_generation_and_anything_else_gives_none() {
        let mut msg = Vec::new();
        msg.extend_from_slice(&(HEADER as u32 + 8 + 8).to_ne_bytes());
        msg.extend_from_slice(&((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN).to_ne_bytes());
        // Flags, sequence number, port, nfgenmsg.
        msg.extend_from_slice(&[0; 2 + 4 + 4 + 4]);
        // NFTA_GEN_PROC_PID first, then the generation, big-endian.
        msg.extend_from_slice(&8u16.to_ne_bytes());
        msg.extend_from_slice(&2u16.to_ne_bytes());
        msg.extend_from_slice(&77u32.to_be_bytes());
        msg.extend_from_slice(&8u16.to_ne_bytes());
        msg.extend_from_slice(&NFTA_GEN_ID.to_ne_bytes());
        msg.extend_from_slice(&4242u32.to_be_bytes());
        assert_eq!(parse(&msg), Some(4242));
        assert_eq!(parse(&msg[..HEADER + 8]), None, "cut short before the generation");
        msg[4..6].copy_from_slice(&2u16.to_ne_bytes());
        assert_eq!(parse(&msg), None, "a netlink error is no generation");
    }
}
