//! What is particular to `SENDMSG_ZC`: the kernel sends from the frame's own pages and, in a
//! second completion (a notification), says when it no longer needs them and whether it had to
//! copy after all (always so on loopback).

/// `IORING_SEND_ZC_REPORT_USAGE`: the notification says whether the kernel copied.
pub(crate) const REPORT_USAGE: u16 = 1 << 3;
/// `IORING_NOTIF_USAGE_ZC_COPIED`, in a notification's result.
const NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;

/// A `SENDMSG_ZC` notification.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Notification {
    /// The kernel copied the pages instead of sending them in place.
    pub(crate) copied: bool,
}

impl Notification {
    pub(crate) fn from_result(res: i32) -> Self {
        Self {
            copied: u32::from_ne_bytes(res.to_ne_bytes()) & NOTIF_USAGE_ZC_COPIED != 0,
        }
    }
}
