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

    /// Make `[.., upto)` available, growing memory when needed.
    fn ensure(&self, upto: usize) -> Room {
        let end = self.end.load(Ordering::Relaxed);
        if upto <= end {
            return Room::Yes;
        }
        // Another allocator of the same instance (wasi-libc's `malloc`, which std's I/O uses on
        // wasip2) may have grown memory since we last did: the pages past our `end` are then
        // its, and ours cannot extend over them.
        if core::arch::wasm32::memory_size(0) * PAGE != end {
            return Room::Moved;
        }
        let pages = (upto - end).div_ceil(PAGE).max(MIN_GROW_PAGES);
        let before = core::arch::wasm32::memory_grow(0, pages);
        if before == usize::MAX {
            return Room::No;
        }
        self.end.store((before + pages) * PAGE, Ordering::Relaxed);
        Room::Yes
    }

    /// Continue at the current end of memory (after what another allocator grew).
    fn skip_foreign_pages(&self) {
        let size = core::arch::wasm32::memory_size(0) * PAGE;
        self.next.store(size, Ordering::Relaxed);
        self.end.store(size, Ordering::Relaxed);
    }

    /// On the first allocation: take the initial heap (from `__heap_base` to the end of the
    /// initial memory) as the first arena.
    ///
    /// wasi-libc's `malloc` (dlmalloc, which std's I/O uses on wasip2: a `println!` reaches it)
    /// claims that same region as its own first segment. So the arena is taken *from* it: one
    /// `malloc` of nearly the whole region, whose block the bump allocator then hands out. Later
    /// `malloc`s of wasi-libc grow memory past it (and [`Bump::ensure`] never extends over those
    /// pages). Without this, a `println!` in a build could overwrite the objects being built.
    fn start(&self) {
        if self.end.load(Ordering::Relaxed) != 0 {
            return;
        }
        unsafe extern "C" {
            static __heap_base: u8;
        }
        // `__heap_base` is the linker's marker of where the heap starts; only its address is
        // taken.
        let base = core::ptr::addr_of!(__heap_base) as usize;
        let end = core::arch::wasm32::memory_size(0) * PAGE;
        // dlmalloc's own headers and footer: a few dozen bytes; leave a page.
        let want = end.saturating_sub(base).saturating_sub(PAGE);
        let (next, limit) = match libc_arena(want) {
            // No libc allocator: the whole heap is ours.
            None => (base.min(end), end),
            // libc's allocator could not give it: start past it, in memory grown for us.
            Some(arena) if arena.is_null() => (end, end),
            Some(arena) => (arena as usize, arena as usize + want),
        };
        self.next.store(next, Ordering::Relaxed);
        self.end.store(limit, Ordering::Relaxed);
    }
}

/// `size` bytes from wasi-libc's `malloc` (null when it cannot): its first segment, taken so
/// that it never hands it out again.
#[cfg(target_os = "wasi")]
fn libc_arena(size: usize) -> Option<*mut u8> {
    unsafe extern "C" {
        fn malloc(size: usize) -> *mut u8;
    }
    if size == 0 {
        return Some(core::ptr::null_mut());
    }
    // SAFETY: `malloc` is wasi-libc's, with C's contract; the block is never freed (it is the
    // arena for the rest of the instance's single call).
    Some(unsafe { malloc(size) })
}

/// Without wasi-libc (`wasm32-unknown-unknown`) nothing else allocates.
#[cfg(not(target_os = "wasi"))]
fn libc_arena(_: usize) -> Option<*mut u8> {
    None
}

/// What [`Bump::ensure`] found.
enum Room {
    /// The memory is there (grown if needed).
    Yes,
    /// Memory was grown by someone else past our end: start over at the end of memory.
    Moved,
    /// Memory cannot grow (the host's cap).
    No,
}

impl Default for Bump {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every block returned is aligned as asked, lies within linear memory (grown first when
// needed) and within pages this allocator grew or started with (never over pages another
// allocator of the instance grew), and is never handed out twice: `next` only moves past blocks in
// use, and moves back only over the most recent block when that block is freed or resized.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.start();
        // At most twice: after another allocator grew memory, once more past its pages.
        for _ in 0..2 {
            let next = self.next.load(Ordering::Relaxed);
            let start = (next + layout.align() - 1) & !(layout.align() - 1);
            let Some(upto) = start.checked_add(layout.size()) else {
                return core::ptr::null_mut();
            };
            match self.ensure(upto) {
                Room::Yes => {
                    self.next.store(upto, Ordering::Relaxed);
                    return start as *mut u8;
                }
                Room::Moved => self.skip_foreign_pages(),
                Room::No => return core::ptr::null_mut(),
            }
        }
        core::ptr::null_mut()
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
            match self.ensure(upto) {
                Room::Yes => {
                    self.next.store(upto, Ordering::Relaxed);
                    return ptr;
                }
                Room::No => return core::ptr::null_mut(),
                // Cannot grow in place over another allocator's pages: copy (below).
                Room::Moved => {}
            }
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
