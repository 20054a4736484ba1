//! Workspace and saved-activation memory: zeroed host bytes aligned to 64 (the reference backend asks 16).

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Block([u8; 64]);

pub(crate) struct AlignedBuffer {
    blocks: Vec<Block>,
    bytes: usize,
}

impl AlignedBuffer {
    pub(crate) fn new(bytes: usize) -> AlignedBuffer {
        AlignedBuffer { blocks: vec![Block([0; 64]); bytes.div_ceil(64)], bytes }
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes
    }

    /// NULL for an empty buffer, as the C API expects for a zero size.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut std::os::raw::c_void {
        if self.bytes == 0 {
            std::ptr::null_mut()
        } else {
            self.blocks.as_mut_ptr().cast()
        }
    }

    pub(crate) fn as_ptr(&self) -> *const std::os::raw::c_void {
        if self.bytes == 0 {
            std::ptr::null()
        } else {
            self.blocks.as_ptr().cast()
        }
    }
}
