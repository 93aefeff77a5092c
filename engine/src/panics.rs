//! The text of a caught panic, for the errors and logs that report it (a handler's panic, a
//! core thread's).

/// The message of a panic payload, if it has one.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}
