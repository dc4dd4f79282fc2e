//! Devices, contexts, ports, GIDs and protection domains.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

use crate::ffi::verbs as ffi;

use super::{Error, Result};

/// The RDMA devices of this machine (`ibv_get_device_list`).
///
/// Opened [`Context`]s stay valid after the list is dropped.
///
/// # Example
///
/// ```
/// use evchan_core::verbs::DeviceList;
///
/// // Natively without RDMA this is an empty list or an error; never a panic.
/// if let Ok(list) = DeviceList::new() {
///     for dev in list.iter() {
///         println!("{} guid {:#018x}", dev.name(), dev.guid());
///     }
/// }
/// ```
///
/// # References
///
/// [`ibv_get_device_list(3)`](https://man7.org/linux/man-pages/man3/ibv_get_device_list.3.html)
#[doc(alias = "ibv_get_device_list")]
#[doc(alias = "ibv_free_device_list")]
#[derive(Debug)]
pub struct DeviceList {
    raw: ffi::DeviceList,
}

impl DeviceList {
    /// `ibv_get_device_list`: lists the devices.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when the kernel has no RDMA support (`ENOSYS`, `ENODEV`); other
    /// failures as [`Error::Io`].
    #[doc(alias = "ibv_get_device_list")]
    pub fn new() -> Result<Self> {
        match ffi::DeviceList::new() {
            Ok(raw) => Ok(DeviceList { raw }),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::ENODEV)) => {
                Err(Error::NoDevice)
            }
            Err(e) => Err(Error::io("ibv_get_device_list")(e)),
        }
    }

    /// How many devices there are.
    #[must_use]
    pub fn len(&self) -> usize {
        self.raw.len()
    }

    /// Whether there is no device.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.raw.len() == 0
    }

    /// The devices, in the library's order.
    pub fn iter(&self) -> impl Iterator<Item = Device<'_>> + '_ {
        (0..self.raw.len()).map(move |index| Device { list: self, index })
    }

    /// The device called `name`, e.g. `"rxe0"`.
    #[must_use]
    pub fn find(&self, name: &str) -> Option<Device<'_>> {
        self.iter().find(|d| d.name() == name)
    }
}

/// One device of a [`DeviceList`].
#[derive(Debug, Clone, Copy)]
pub struct Device<'list> {
    list: &'list DeviceList,
    index: usize,
}

impl Device<'_> {
    /// `ibv_get_device_name`: the kernel's name of the device, e.g. `"rxe0"`.
    #[doc(alias = "ibv_get_device_name")]
    #[must_use]
    pub fn name(&self) -> String {
        self.list.raw.name(self.index).unwrap_or_default()
    }

    /// `ibv_get_device_guid`: the node GUID, in host byte order.
    #[doc(alias = "ibv_get_device_guid")]
    #[must_use]
    pub fn guid(&self) -> u64 {
        self.list.raw.guid(self.index).unwrap_or(0)
    }

    /// `ibv_open_device`: opens the device.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_open_device` error.
    #[doc(alias = "ibv_open_device")]
    pub fn open(&self) -> Result<Context> {
        let raw = self
            .list
            .raw
            .open(self.index)
            .map_err(Error::io("ibv_open_device"))?;
        Context::from_raw(raw)
    }
}

/// An open RDMA device (`struct ibv_context`): the parent of every other verbs object, and the
/// source of async device events.
///
/// The async event fd ([`AsFd`]) of a context opened here is non-blocking; that of an rdma_cm
/// id's context ([`CmId::context`](crate::CmId::context)), shared with the rest of the process,
/// keeps its flags. Either way [`Context::try_get_async_event`] never waits for an event; see
/// [`Context::get_async_event`].
///
/// # Example
///
/// ```no_run
/// use evchan_core::verbs::Context;
///
/// # fn main() -> Result<(), evchan_core::verbs::Error> {
/// let ctx = Context::open_first()?;
/// for port in ctx.ports()? {
///     println!("{}/{}: {:?}", ctx.name(), port.number, port.state);
///     for gid in ctx.gids(port.number)? {
///         println!("  [{}] {} {:?}", gid.index, gid.ipv6(), gid.gid_type);
///     }
/// }
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_open_device(3)`](https://man7.org/linux/man-pages/man3/ibv_open_device.3.html),
/// [`ibv_query_port(3)`](https://man7.org/linux/man-pages/man3/ibv_query_port.3.html),
/// [`ibv_query_gid(3)`](https://man7.org/linux/man-pages/man3/ibv_query_gid.3.html)
#[doc(alias = "ibv_context")]
#[doc(alias = "ibv_open_device")]
#[doc(alias = "ibv_close_device")]
#[derive(Debug)]
pub struct Context {
    pub(super) raw: ffi::Context,
}

impl Context {
    /// The safe handle of `raw`; the async event fd of a context we opened is set
    /// `O_NONBLOCK`. librdmacm's context (from [`CmId::context`](crate::CmId::context)) is
    /// shared with the rest of the process: its fd is left as it is, and non-blocking reads of
    /// it poll first (see [`Context::try_get_async_event`]).
    pub(super) fn from_raw(raw: ffi::Context) -> Result<Self> {
        if raw.is_own() {
            evchan_sys::fd::set_nonblocking(raw.async_fd(), true).map_err(Error::io("fcntl"))?;
        }
        Ok(Context { raw })
    }

    /// librdmacm's own contexts (`rdma_get_devices`), one per RDMA device: the contexts that
    /// rdma_cm ids use. A [`Pd`], [`CompChannel`](super::CompChannel) or [`Cq`](super::Cq)
    /// made on one of them is accepted by
    /// [`CmId::create_qp_with`](crate::CmId::create_qp_with) for every id on that device, so a
    /// server can make them before its first `CONNECT_REQUEST` (a context from
    /// [`Context::open`] is a different one, and refused there). Each handle keeps its device
    /// in librdmacm's list until it is dropped; it is never `ibv_close_device`d (librdmacm
    /// owns it). [`Context::name`] tells them apart.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when there is no RDMA device; [`Error::Io`] with the
    /// `rdma_get_devices` error otherwise.
    #[doc(alias = "rdma_get_devices")]
    pub fn rdma_cm_devices() -> Result<Vec<Self>> {
        let raw = match ffi::Context::all_cm_devices() {
            // librdmacm's answer when it lists no device (e.g. the last one was removed).
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Err(Error::NoDevice),
            r => r.map_err(Error::io("rdma_get_devices"))?,
        };
        if raw.is_empty() {
            return Err(Error::NoDevice);
        }
        raw.into_iter().map(Self::from_raw).collect()
    }

    /// `ibv_open_device` on the first device of [`DeviceList`].
    ///
    /// # Errors
    /// [`Error::NoDevice`] when there is none; otherwise as [`Device::open`].
    #[doc(alias = "ibv_open_device")]
    pub fn open_first() -> Result<Self> {
        let list = DeviceList::new()?;
        let dev = list.iter().next().ok_or(Error::NoDevice)?;
        dev.open()
    }

    /// `ibv_open_device` on the device called `name`.
    ///
    /// # Errors
    /// [`Error::NoDevice`] when there is no device at all, [`Error::DeviceNotFound`] when none
    /// has that name; otherwise as [`Device::open`].
    #[doc(alias = "ibv_open_device")]
    pub fn open(name: &str) -> Result<Self> {
        let list = DeviceList::new()?;
        if list.is_empty() {
            return Err(Error::NoDevice);
        }
        let dev = list
            .find(name)
            .ok_or_else(|| Error::DeviceNotFound(name.to_owned()))?;
        dev.open()
    }

    /// `ibv_get_device_name` of the context's device.
    #[doc(alias = "ibv_get_device_name")]
    #[must_use]
    pub fn name(&self) -> String {
        self.raw.name()
    }

    /// `ibv_query_device`'s `phys_port_cnt`: ports are numbered `1..=port_count`.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_query_device` error.
    #[doc(alias = "ibv_query_device")]
    pub fn port_count(&self) -> Result<u8> {
        self.raw.port_count().map_err(Error::io("ibv_query_device"))
    }

    /// The most RDMA READs and atomics a QP of this device takes at once as a responder
    /// (`ibv_query_device`'s `max_qp_rd_atom`, for rdma_cm's `responder_resources`) and has
    /// in flight as an initiator (`max_qp_init_rd_atom`, for `initiator_depth`), each capped
    /// at 255 (what the CM's fields hold).
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_query_device` error.
    #[doc(alias = "max_qp_rd_atom")]
    pub fn max_reads(&self) -> Result<(u8, u8)> {
        let (responder, initiator) = self
            .raw
            .read_atomic_limits()
            .map_err(Error::io("ibv_query_device"))?;
        let cap = |n: i32| u8::try_from(n.max(0)).unwrap_or(u8::MAX);
        Ok((cap(responder), cap(initiator)))
    }

    /// `ibv_query_port`: the attributes of port `port` (1-based).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for port 0; [`Error::Io`] with the `ibv_query_port` error.
    #[doc(alias = "ibv_query_port")]
    pub fn port(&self, port: u8) -> Result<Port> {
        if port == 0 {
            return Err(Error::InvalidArgument("ports are numbered from 1"));
        }
        let p = self
            .raw
            .query_port(port)
            .map_err(Error::io("ibv_query_port"))?;
        Ok(Port {
            number: port,
            state: PortState::from_raw(p.state),
            max_mtu: Mtu::from_raw(p.max_mtu),
            active_mtu: Mtu::from_raw(p.active_mtu),
            gid_table_len: u32::try_from(p.gid_tbl_len).unwrap_or(0),
            lid: p.lid,
            link_layer: LinkLayer::from_raw(p.link_layer),
        })
    }

    /// Every port ([`Context::port`] for `1..=port_count`).
    ///
    /// # Errors
    /// As [`Context::port_count`] and [`Context::port`].
    pub fn ports(&self) -> Result<Vec<Port>> {
        (1..=self.port_count()?).map(|p| self.port(p)).collect()
    }

    /// `ibv_query_gid_ex`: the GID table entry `index` of `port`.
    ///
    /// # Errors
    /// [`Error::Io`]: `ENODATA` for an empty entry, `EINVAL` for an index past the table.
    #[doc(alias = "ibv_query_gid_ex")]
    #[doc(alias = "ibv_query_gid")]
    pub fn gid(&self, port: u8, index: u32) -> Result<Gid> {
        let g = self
            .raw
            .query_gid(port, index)
            .map_err(Error::io("ibv_query_gid_ex"))?;
        Ok(Gid {
            index: g.index,
            raw: g.raw,
            gid_type: GidType::from_raw(g.gid_type),
            ifindex: g.ndev_ifindex,
        })
    }

    /// The populated entries of `port`'s GID table (empty entries are skipped).
    ///
    /// # Errors
    /// As [`Context::port`].
    pub fn gids(&self, port: u8) -> Result<Vec<Gid>> {
        let len = self.port(port)?.gid_table_len;
        Ok((0..len)
            .filter_map(|i| self.gid(port, i).ok())
            .filter(|g| g.raw != [0; 16])
            .collect())
    }

    /// The context's async event fd (`ibv_context::async_fd`): non-blocking for a context opened
    /// here, as librdmacm left it for an rdma_cm id's. Whatever its flags (a dup of it shares
    /// them, and safe code may change them), the reads of [`Context::try_get_async_event`] and
    /// the timed read are made only once a zero-timeout `poll` says an event is queued, and are
    /// serialised among evchan's readers, so they do not wait in the read.
    #[must_use]
    pub fn async_fd(&self) -> BorrowedFd<'_> {
        self.raw.async_fd()
    }
}

impl AsFd for Context {
    /// The async event fd, see [`Context::get_async_event`].
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.raw.async_fd()
    }
}

impl AsRawFd for Context {
    fn as_raw_fd(&self) -> RawFd {
        self.raw.async_fd().as_raw_fd()
    }
}

/// Port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PortState {
    /// `IBV_PORT_NOP`
    Nop,
    /// `IBV_PORT_DOWN`
    Down,
    /// `IBV_PORT_INIT`
    Init,
    /// `IBV_PORT_ARMED`
    Armed,
    /// `IBV_PORT_ACTIVE`
    Active,
    /// `IBV_PORT_ACTIVE_DEFER`
    ActiveDefer,
    /// A value this crate does not know.
    Unknown(u32),
}

impl PortState {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => PortState::Nop,
            1 => PortState::Down,
            2 => PortState::Init,
            3 => PortState::Armed,
            4 => PortState::Active,
            5 => PortState::ActiveDefer,
            v => PortState::Unknown(v),
        }
    }
}

/// Path MTU (`enum ibv_mtu`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Mtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
    /// A value this crate does not know.
    Unknown(u32),
}

impl Mtu {
    pub(crate) fn from_raw(v: u32) -> Self {
        match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            v => Mtu::Unknown(v),
        }
    }

    pub(crate) fn to_raw(self) -> u32 {
        match self {
            Mtu::Mtu256 => 1,
            Mtu::Mtu512 => 2,
            Mtu::Mtu1024 => 3,
            Mtu::Mtu2048 => 4,
            Mtu::Mtu4096 => 5,
            Mtu::Unknown(v) => v,
        }
    }

    /// The MTU in bytes, `None` for an unknown value.
    #[must_use]
    pub fn bytes(self) -> Option<u32> {
        match self {
            Mtu::Unknown(_) => None,
            m => Some(128 << m.to_raw()),
        }
    }
}

/// Link layer of a port (`IBV_LINK_LAYER_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LinkLayer {
    /// Not reported.
    Unspecified,
    /// InfiniBand.
    InfiniBand,
    /// Ethernet (RoCE, soft-RoCE, iWARP).
    Ethernet,
    /// A value this crate does not know.
    Unknown(u8),
}

impl LinkLayer {
    fn from_raw(v: u8) -> Self {
        match v {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            v => LinkLayer::Unknown(v),
        }
    }
}

/// Attributes of one port (`struct ibv_port_attr`, the fields evchan uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Port {
    /// The port number (1-based).
    pub number: u8,
    /// Logical state.
    pub state: PortState,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// Length of the GID table.
    pub gid_table_len: u32,
    /// Base LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Link layer.
    pub link_layer: LinkLayer,
}

/// GID type (`enum ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GidType {
    /// `IBV_GID_TYPE_IB`
    Ib,
    /// `IBV_GID_TYPE_ROCE_V1`
    RoceV1,
    /// `IBV_GID_TYPE_ROCE_V2` (routable: UDP/IP)
    RoceV2,
    /// A value this crate does not know.
    Unknown(u32),
}

impl GidType {
    fn from_raw(v: u32) -> Self {
        match v {
            0 => GidType::Ib,
            1 => GidType::RoceV1,
            2 => GidType::RoceV2,
            v => GidType::Unknown(v),
        }
    }
}

/// One GID table entry (`struct ibv_gid_entry`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Gid {
    /// Index in the port's GID table (the `sgid_index` of a route that uses it).
    pub index: u32,
    /// The 16 bytes, network order.
    pub raw: [u8; 16],
    /// IB, RoCE v1 or RoCE v2.
    pub gid_type: GidType,
    /// The netdev's interface index (RoCE), 0 otherwise.
    pub ifindex: u32,
}

impl Gid {
    /// The GID as an IPv6 address (for RoCE, the interface address; IPv4 as `::ffff:a.b.c.d`).
    #[must_use]
    pub fn ipv6(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.raw)
    }

    /// The IPv4 address for an IPv4-mapped GID.
    #[must_use]
    pub fn ipv4(&self) -> Option<Ipv4Addr> {
        self.ipv6().to_ipv4_mapped()
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gid")
            .field("index", &self.index)
            .field("gid", &self.ipv6())
            .field("gid_type", &self.gid_type)
            .field("ifindex", &self.ifindex)
            .finish()
    }
}

/// A protection domain (`ibv_alloc_pd` / `ibv_dealloc_pd`): memory regions and QPs of one PD
/// may be used together.
///
/// # Example
///
/// ```no_run
/// use evchan_core::verbs::{Context, Pd};
///
/// # fn main() -> Result<(), evchan_core::verbs::Error> {
/// let ctx = Context::open_first()?;
/// let pd = Pd::new(&ctx)?;
/// let mr = pd.reg_mr(vec![0u8; 4096])?;
/// assert_eq!(mr.len(), 4096);
/// # Ok(())
/// # }
/// ```
///
/// # References
///
/// [`ibv_alloc_pd(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_pd.3.html)
#[doc(alias = "ibv_pd")]
#[doc(alias = "ibv_alloc_pd")]
#[doc(alias = "ibv_dealloc_pd")]
#[derive(Debug)]
pub struct Pd<'ctx> {
    pub(crate) raw: ffi::Pd<'ctx>,
}

impl<'ctx> Pd<'ctx> {
    /// `ibv_alloc_pd`.
    ///
    /// # Errors
    /// [`Error::Io`] with the `ibv_alloc_pd` error.
    #[doc(alias = "ibv_alloc_pd")]
    pub fn new(ctx: &'ctx Context) -> Result<Self> {
        Ok(Pd {
            raw: ffi::Pd::new(&ctx.raw).map_err(Error::io("ibv_alloc_pd"))?,
        })
    }
}
