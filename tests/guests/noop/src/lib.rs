//! Test guest `noop`: one tool, `noop`, that returns `{}`, and nothing else,
//! so that a benchmark measures the sandbox rather than the guest.
//!
//! On wasm32 the crate is `no_std` with a bump allocator, its own
//! `cabi_realloc` (on wasip2 wasi-libc provides it, and there is no libc here)
//! and a panic handler that traps, so the component imports nothing from
//! WASI: no libc start-up, no environment, no stdio. (A std build of the same code imports
//! `wasi:cli/*` and `wasi:io/*`.) Natively it is an ordinary std crate, so
//! the workspace's clippy and tests can build it.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

mod bindings {
    //! wit-bindgen glue for the `tool-plugin` world, and the export of
    //! [`Noop`](super::Noop): the only generated unsafe code.
    #![allow(missing_docs, unsafe_code, clippy::all)]
    wit_bindgen::generate!({ path: "../../../wit", world: "tool-plugin" });
    use super::Noop;
    export!(Noop with_types_in crate::bindings);
}

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use bindings::exports::warden::plugin::tool::Guest;
use bindings::warden::plugin::types::{Call, Effect, Preview, ToolError, ToolOutput, ToolSpec};

struct Noop;

impl Guest for Noop {
    fn describe() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "noop".into(),
            description: "Does nothing and returns {}.".into(),
            input_schema: r#"{"type":"object"}"#.into(),
            effect: Effect::Read,
        }]
    }

    fn preflight(_call: Call) -> Result<Preview, ToolError> {
        Ok(Preview {
            summary: "noop".into(),
            detail: String::new(),
        })
    }

    fn invoke(_call: Call) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput {
            content: "{}".into(),
        })
    }
}

/// A panic is a trap: `unreachable`, as with std's `panic = "abort"`.
#[cfg(target_arch = "wasm32")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    core::arch::wasm32::unreachable()
}

#[cfg(target_arch = "wasm32")]
mod bump {
    //! The allocator: a bump pointer over pages taken with `memory.grow`,
    //! never freed. Each call runs in a fresh instance, so memory goes back
    //! with the instance.
    #![allow(unsafe_code)]

    use alloc::alloc::{alloc, realloc};
    use core::alloc::{GlobalAlloc, Layout};
    use core::arch::wasm32::unreachable;
    use core::arch::wasm32::{memory_grow, memory_size};
    use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    const PAGE: usize = 64 * 1024;

    /// `next` is the first free byte, `end` the end of memory; both 0 until
    /// the first allocation, which starts at the end of the initial memory
    /// (past the stack and static data).
    struct Bump {
        next: AtomicUsize,
        end: AtomicUsize,
    }

    #[global_allocator]
    static ALLOCATOR: Bump = Bump {
        next: AtomicUsize::new(0),
        end: AtomicUsize::new(0),
    };

    // SAFETY: `alloc` returns a fresh, suitably aligned block inside linear
    // memory that no other allocation overlaps, or null; the instance is
    // single-threaded, so the relaxed atomics are never raced.
    unsafe impl GlobalAlloc for Bump {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let (mut next, mut end) = (self.next.load(Relaxed), self.end.load(Relaxed));
            if end == 0 {
                end = memory_size(0) * PAGE;
                next = end;
            }
            let start = (next + layout.align() - 1) & !(layout.align() - 1);
            let Some(new_next) = start.checked_add(layout.size()) else {
                return core::ptr::null_mut();
            };
            if new_next > end {
                let pages = (new_next - end).div_ceil(PAGE);
                if memory_grow(0, pages) == usize::MAX {
                    return core::ptr::null_mut();
                }
                end += pages * PAGE;
            }
            self.next.store(new_next, Relaxed);
            self.end.store(end, Relaxed);
            core::ptr::with_exposed_provenance_mut(start)
        }

        unsafe fn dealloc(&self, _ptr: *mut u8, _layout: Layout) {}
    }

    /// The canonical ABI's allocator export, through which the host writes
    /// arguments into linear memory. Traps when memory runs out.
    #[unsafe(no_mangle)]
    unsafe extern "C" fn cabi_realloc(
        old_ptr: *mut u8,
        old_len: usize,
        align: usize,
        new_len: usize,
    ) -> *mut u8 {
        if new_len == 0 {
            return core::ptr::without_provenance_mut(align);
        }
        let Ok(layout) = Layout::from_size_align(new_len, align) else {
            unreachable()
        };
        // SAFETY: `layout` has a non-zero size; a non-zero `old_len` means the
        // host got `old_ptr` from this function with `old_len` and `align`.
        let ptr = unsafe {
            if old_len == 0 {
                alloc(layout)
            } else {
                realloc(
                    old_ptr,
                    Layout::from_size_align_unchecked(old_len, align),
                    new_len,
                )
            }
        };
        if ptr.is_null() {
            unreachable()
        }
        ptr
    }
}
