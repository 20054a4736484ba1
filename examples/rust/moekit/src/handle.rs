//! The handle: one backend, owned, destroyed on drop.
use std::cell::Cell;
use std::marker::PhantomData;

use moekit_sys as sys;

use crate::error::{check, Result};

/// A reference-backend (CPU) handle. It may move to another thread (`Send`) but not be shared between threads
/// (`!Sync`): the C API allows one call at a time per handle, and every plan made from it borrows it.
pub struct Handle {
    raw: sys::moekit_handle_t,
    _not_sync: PhantomData<Cell<()>>,
}

// SAFETY: moekit handles may be used from any thread, one call at a time; `!Sync` and the plans' borrows keep
// the calls on one thread at a time.
unsafe impl Send for Handle {}

impl Handle {
    /// The reference backend with one worker thread per core. Results do not depend on the thread count.
    pub fn reference() -> Result<Handle> {
        Handle::reference_with_threads(0)
    }

    /// The reference backend with `threads` workers (0: one per core).
    pub fn reference_with_threads(threads: usize) -> Result<Handle> {
        let mut desc = sys::moekit_handle_desc_t::default();
        // SAFETY: desc is a valid, writable struct.
        check(unsafe { sys::moekit_handle_desc_init(&mut desc) })?;
        desc.backend = sys::MOEKIT_BACKEND_REFERENCE;
        desc.num_threads = i32::try_from(threads)
            .map_err(|_| crate::Error::invalid_value(format!("threads: {threads} does not fit an int32")))?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: desc is initialised; raw is written only on success.
        check(unsafe { sys::moekit_handle_create(&desc, &mut raw) })?;
        Ok(Handle { raw, _not_sync: PhantomData })
    }

    /// The raw handle, for calls through [`crate::sys`]. It stays owned by this `Handle`.
    pub fn as_raw(&self) -> sys::moekit_handle_t {
        self.raw
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: raw came from moekit_handle_create; every plan borrowing it is already gone. Destroying a valid
        // handle cannot fail.
        let _ = unsafe { sys::moekit_handle_destroy(self.raw) };
    }
}
