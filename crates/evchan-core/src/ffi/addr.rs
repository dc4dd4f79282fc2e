//! `std::net::SocketAddr` ⇄ C `struct sockaddr` conversions.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A socket address laid out as C expects it, big enough for IPv4 and IPv6.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) union SockAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
    storage: libc::sockaddr_storage,
}

impl SockAddr {
    /// Lays out `addr` as a `sockaddr_in` / `sockaddr_in6` (port and flow info in network order).
    pub(crate) fn new(addr: SocketAddr) -> Self {
        match addr {
            SocketAddr::V4(a) => SockAddr {
                v4: libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(a.ip().octets()),
                    },
                    sin_zero: [0; 8],
                },
            },
            SocketAddr::V6(a) => SockAddr {
                v6: libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo().to_be(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: a.scope_id(),
                },
            },
        }
    }

    /// The address as the `struct sockaddr *` that librdmacm takes (it never writes through it).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        std::ptr::from_mut(self).cast()
    }
}

/// Reads an IPv4 or IPv6 socket address from C memory; `None` for other families or a zero
/// family (an address not set yet).
///
/// # Safety
///
/// `sa` is valid for reads of a `sockaddr_in6` when its family is `AF_INET6`, of a `sockaddr_in`
/// when it is `AF_INET`, and of a `sockaddr` in any case (librdmacm's address unions are
/// `sockaddr_storage`-sized, so any pointer into them qualifies).
pub(crate) unsafe fn read(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees `sa` is readable as a `sockaddr`.
    let family = i32::from(unsafe { (*sa).sa_family });
    match family {
        libc::AF_INET => {
            // SAFETY: family AF_INET: the caller guarantees a readable `sockaddr_in`.
            let sin = unsafe { sa.cast::<libc::sockaddr_in>().read_unaligned() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: family AF_INET6: the caller guarantees a readable `sockaddr_in6`.
            let sin6 = unsafe { sa.cast::<libc::sockaddr_in6>().read_unaligned() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `if_nametoindex(3)`: the index of the network interface `name`, e.g. the scope id of a
/// link-local IPv6 address on it. `None` when there is no such interface.
pub(crate) fn if_index(name: &str) -> Option<u32> {
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(addr: SocketAddr) -> Option<SocketAddr> {
        let sa = SockAddr::new(addr);
        // SAFETY: `sa` is a live `SockAddr`, large enough for either family.
        unsafe { read(std::ptr::from_ref(&sa).cast()) }
    }

    #[test]
    fn v4_round_trips_with_network_order() {
        let addr: SocketAddr = "169.254.77.1:7471".parse().unwrap();
        assert_eq!(round_trip(addr), Some(addr));
        let sa = SockAddr::new(addr);
        // SAFETY: built from a V4 address just above.
        let sin = unsafe { sa.v4 };
        assert_eq!(sin.sin_port, 7471u16.to_be());
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [169, 254, 77, 1]);
    }

    #[test]
    fn v6_round_trips_with_scope() {
        let addr = SocketAddr::V6(SocketAddrV6::new(
            "fe80::ff:fe00:1".parse().unwrap(),
            9,
            0,
            3,
        ));
        assert_eq!(round_trip(addr), Some(addr));
    }

    #[test]
    fn unknown_family_reads_as_none() {
        // SAFETY: all-zero bytes are a valid `sockaddr_storage`.
        let storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: `storage` is large enough for any family.
        assert_eq!(unsafe { read(std::ptr::from_ref(&storage).cast()) }, None);
    }

    #[test]
    fn if_index_of_loopback_and_missing() {
        assert!(if_index("lo").is_some());
        assert_eq!(if_index("no-such-if0"), None);
        assert_eq!(if_index("bad\0name"), None);
    }
}
