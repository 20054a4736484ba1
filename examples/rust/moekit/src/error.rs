//! Errors: the library's status and the message it left for this thread.
use std::fmt;

use moekit_sys as sys;

/// `moekit_status_t` other than success. `Other` holds a value this crate does not know (a newer library).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidValue,
    ValidationFailed,
    NotSupported,
    InsufficientWorkspace,
    OutOfMemory,
    ExecutionFailed,
    InternalError,
    Other(i32),
}

impl Status {
    fn from_raw(status: sys::moekit_status_t) -> Status {
        match status {
            sys::MOEKIT_STATUS_INVALID_VALUE => Status::InvalidValue,
            sys::MOEKIT_STATUS_VALIDATION_FAILED => Status::ValidationFailed,
            sys::MOEKIT_STATUS_NOT_SUPPORTED => Status::NotSupported,
            sys::MOEKIT_STATUS_INSUFFICIENT_WORKSPACE => Status::InsufficientWorkspace,
            sys::MOEKIT_STATUS_OUT_OF_MEMORY => Status::OutOfMemory,
            sys::MOEKIT_STATUS_EXECUTION_FAILED => Status::ExecutionFailed,
            sys::MOEKIT_STATUS_INTERNAL_ERROR => Status::InternalError,
            other => Status::Other(other.0),
        }
    }

    fn to_raw(self) -> sys::moekit_status_t {
        match self {
            Status::InvalidValue => sys::MOEKIT_STATUS_INVALID_VALUE,
            Status::ValidationFailed => sys::MOEKIT_STATUS_VALIDATION_FAILED,
            Status::NotSupported => sys::MOEKIT_STATUS_NOT_SUPPORTED,
            Status::InsufficientWorkspace => sys::MOEKIT_STATUS_INSUFFICIENT_WORKSPACE,
            Status::OutOfMemory => sys::MOEKIT_STATUS_OUT_OF_MEMORY,
            Status::ExecutionFailed => sys::MOEKIT_STATUS_EXECUTION_FAILED,
            Status::InternalError => sys::MOEKIT_STATUS_INTERNAL_ERROR,
            Status::Other(value) => sys::moekit_status_t(value),
        }
    }

    /// The library's name for the status, e.g. "MOEKIT_STATUS_INVALID_VALUE".
    pub fn name(self) -> String {
        // SAFETY: moekit_status_string returns static NUL-terminated text for every value.
        let text = unsafe { std::ffi::CStr::from_ptr(sys::moekit_status_string(self.to_raw())) };
        text.to_string_lossy().into_owned()
    }
}

/// A failed call: the status and the library's message naming the argument and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
}

impl Error {
    /// An error raised by this crate itself (a view whose shape does not cover its slice), in the library's terms.
    pub(crate) fn invalid_value(message: String) -> Error {
        Error { status: Status::InvalidValue, message }
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.name(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Ok on success; otherwise the status with this thread's last error message (read right away, on the same thread
/// as the failed call, since the message is thread-local).
pub(crate) fn check(status: sys::moekit_status_t) -> Result<()> {
    if status == sys::MOEKIT_SUCCESS {
        return Ok(());
    }
    Err(Error { status: Status::from_raw(status), message: last_error() })
}

fn last_error() -> String {
    // SAFETY: a NULL buffer with capacity 0 only asks for the length.
    let length = unsafe { sys::moekit_get_last_error(std::ptr::null_mut(), 0) };
    let mut buffer = vec![0u8; length + 1];
    // SAFETY: the buffer holds length + 1 bytes, the capacity passed.
    unsafe { sys::moekit_get_last_error(buffer.as_mut_ptr().cast(), buffer.len()) };
    buffer.truncate(length);
    String::from_utf8_lossy(&buffer).into_owned()
}
