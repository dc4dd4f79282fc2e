//! Is there a usable RDMA device?

use crate::error::{Error, NoDevice, Result};
use crate::EventChannel;

/// Probes for a usable RDMA device: opens an event channel (`rdma_create_event_channel`) and
/// lists the devices librdmacm sees (`rdma_get_devices`).
///
/// Returns the devices' names, e.g. `["rxe0"]`. Tests use it to decide between running and
/// skipping.
///
/// ```
/// match evchan_core::device::probe() {
///     Ok(devices) => println!("RDMA devices: {devices:?}"),
///     Err(e) => println!("{e}"), // says how to get a device
/// }
/// ```
///
/// # Errors
/// [`Error::NoDevice`] when there is none; another [`Error`] when the probe itself fails.
#[doc(alias = "rdma_get_devices")]
pub fn probe() -> Result<Vec<String>> {
    let _channel = EventChannel::new()?;
    let names = crate::ffi::cm::device_names().map_err(|e| Error::os("rdma_get_devices", e))?;
    if names.is_empty() {
        return Err(NoDevice::new("rdma_get_devices").into());
    }
    Ok(names)
}
