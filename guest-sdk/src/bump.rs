//! The guests' allocator: a bump allocator (wasm32 only).
//!
//! A builder runs in a fresh instance that serves exactly one call and is then thrown away, so
//! freeing memory is wasted work: allocation is a pointer bump, deallocation does nothing (but for
//! the most recent allocation, which is taken back, so a growing `Vec` or `String` extends in
//! place). Linear memory grows in steps of at least 1 MiB, so a build rarely grows it more than
//! once. The host's memory cap still holds: when memory cannot grow, allocation fails and the call
//! traps with the memory-cap error, as with any allocator.
//!
//! [`crate::export_plugin!`] installs it; a plugin written against the WIT contract directly can
//! install it with [`crate::use_bump_allocator!`].

#![allow(
    unsafe_code,
    reason = "a global allocator is unsafe by definition; every use is commented"
)]

use core::{
    alloc::{GlobalAlloc, Layout},
    sync::atomic::{AtomicUsize, Ordering},
};

const PAGE: usize = 64 * 1024;
/// The least memory grows by: 16 pages (1 MiB).
const MIN_GROW_PAGES: usize = 16;

/// The bump allocator. Single-threaded (wasm32 guests have one thread); the atomics compile to
/// plain loads and stores there.
#[derive(Debug)]
pub struct Bump {
    next: AtomicUsize,
    end: AtomicUsize,
}

impl Bump {
    /// An allocator that starts at the heap base on its first allocation.
    pub const fn new() -> Self {
        Bump {
            next: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
        }
    }

    /// Make `[next, next + size)` available, growing memory when needed; the new `end`, or `None`.
    fn ensure(&self, upto: usize) -> Option<usize> {
        let end = self.end.load(Ordering::Relaxed);
        if upto <= end {
            return Some(end);
        }
        let pages = (upto - end).div_ceil(PAGE).max(MIN_GROW_PAGES);
        let before = core::arch::wasm32::memory_grow(0, pages);
        if before == usize::MAX {
            return None;
        }
        let end = (before + pages) * PAGE;
        self.end.store(end, Ordering::Relaxed);
        Some(end)
    }

    fn start(&self) {
        if self.end.load(Ordering::Relaxed) == 0 {
            unsafe extern "C" {
                static __heap_base: u8;
            }
            // `__heap_base` is the linker's marker of where the heap starts; only its address is
            // taken.
            let base = core::ptr::addr_of!(__heap_base) as usize;
            self.next.store(base, Ordering::Relaxed);
            self.end
                .store(core::arch::wasm32::memory_size(0) * PAGE, Ordering::Relaxed);
        }
    }
}

impl Default for Bump {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every block returned is aligned as asked, lies within linear memory (grown first when
// needed), and is never handed out twice: `next` only moves past blocks in use, and moves back only
// over the most recent block when that block is freed or resized.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.start();
        let next = self.next.load(Ordering::Relaxed);
        let start = (next + layout.align() - 1) & !(layout.align() - 1);
        let Some(upto) = start.checked_add(layout.size()) else {
            return core::ptr::null_mut();
        };
        if self.ensure(upto).is_none() {
            return core::ptr::null_mut();
        }
        self.next.store(upto, Ordering::Relaxed);
        start as *mut u8
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // Take back only the most recent block: nothing after it is in use.
        if ptr as usize + layout.size() == self.next.load(Ordering::Relaxed) {
            self.next.store(ptr as usize, Ordering::Relaxed);
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let addr = ptr as usize;
        // The most recent block grows or shrinks in place.
        if addr + layout.size() == self.next.load(Ordering::Relaxed) {
            let Some(upto) = addr.checked_add(new_size) else {
                return core::ptr::null_mut();
            };
            if self.ensure(upto).is_none() {
                return core::ptr::null_mut();
            }
            self.next.store(upto, Ordering::Relaxed);
            return ptr;
        }
        if new_size <= layout.size() {
            return ptr;
        }
        // SAFETY: `new_size` with the old alignment is a valid layout (the caller guarantees it
        // does not overflow when rounded to the alignment); the old block is valid for
        // `layout.size()` bytes and the new one for more, and they do not overlap (the new one is
        // past `next`).
        unsafe {
            let new = self.alloc(Layout::from_size_align_unchecked(new_size, layout.align()));
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size());
            }
            new
        }
    }
}
