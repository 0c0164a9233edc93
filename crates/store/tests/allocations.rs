//! `Store::revision` and `Store::count` of a store that answers from memory allocate nothing,
//! through `dyn Store` as the API server calls them: on every read that waits for a revision, and
//! for every kind on every metrics scrape.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use shepherd_store::{HistoryLimits, LocalStore, Store};

/// Counts the allocations of the thread that asks (the store's own threads are not counted).
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every call is passed on to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

#[test]
fn asking_a_local_store_for_its_revision_or_a_count_allocates_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    rt.block_on(async {
        let stores: [(&str, Arc<dyn Store>); 2] = [
            ("memory", Arc::new(LocalStore::in_memory(HistoryLimits::default()))),
            (
                "embedded",
                Arc::new(LocalStore::open_redb(&dir.path().join("s.redb"), HistoryLimits::default()).expect("open")),
            ),
        ];
        for (name, store) in stores {
            store.create("/a", bytes::Bytes::from_static(b"v")).await.expect("create");
            let before = ALLOCATIONS.with(Cell::get);
            for _ in 0..1000 {
                assert_eq!(store.revision().await.expect("revision"), 1, "{name}");
                assert_eq!(store.count("/").await.expect("count"), 1, "{name}");
            }
            assert_eq!(ALLOCATIONS.with(Cell::get) - before, 0, "{name}: allocations for 1000 revisions and counts");
            store.close().await.expect("close");
        }
    });
}
