//! Values kept compressed in memory: zstd against a dictionary per kind, learnt from the values.
//! The store keeps its current objects so, and the informer caches their objects' text.
//!
//! The objects of one kind are mostly the same JSON: the same field names, the same
//! `managedFields`, often the same template. One stored value of the kind, used as a raw-content
//! dictionary, lets zstd write the others as little more than what differs (a 3.8 KB pod of a
//! Deployment packs into about a hundred bytes; zstd alone gets about a third). The caller names
//! the kind of each value ([`kind_of`] reads it from a store key).
//!
//! A kind's dictionary starts as its first value that is neither tiny nor huge. An object goes
//! through a few shapes (a pod pending, bound, running), so when a value packs poorly (to more
//! than a tenth of its size) and enough values were packed since the dictionary last changed, the
//! value is added to the dictionary, whose oldest samples go beyond [`DICTIONARY_BYTES`]. Values
//! packed before keep the dictionary they were packed with alive (its bytes only: the prepared
//! compression tables are kept for the current one).

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use zstd_safe::{CCtx, CDict, DCtx};

/// Values shorter than this are kept as they are.
const SMALLEST_PACKED: usize = 64;
/// Largest value that joins a dictionary: a huge value is rarely like the others.
const LARGEST_SAMPLE: usize = 16 * 1024;
/// Most bytes of samples a dictionary holds (its prepared tables grow with it).
const DICTIONARY_BYTES: usize = 32 * 1024;
/// Values a dictionary packs before a value packed poorly against it may join it.
const DICTIONARY_TENURE: u32 = 256;
/// zstd's level: its fastest, which with a dictionary compresses about as well as the next ones.
const LEVEL: i32 = 1;

/// One stored value, packed or not.
#[derive(Clone)]
pub enum Packed {
    Raw(Bytes),
    /// `dictionary`: the bytes it was packed against, which unpacking needs.
    Zstd { dictionary: Option<Arc<[u8]>>, data: Box<[u8]>, len: u32 },
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Packed::Raw(b) => f.debug_tuple("Raw").field(&b.len()).finish(),
            Packed::Zstd { data, len, .. } => f.debug_struct("Zstd").field("len", len).field("packed", &data.len()).finish(),
        }
    }
}

thread_local! {
    static CONTEXTS: RefCell<Option<(CCtx<'static>, DCtx<'static>)>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's zstd contexts, made on first use.
fn with_contexts<T>(f: impl FnOnce(&mut CCtx<'static>, &mut DCtx<'static>) -> T) -> T {
    CONTEXTS.with_borrow_mut(|slot| {
        let (c, d) = slot.get_or_insert_with(|| (CCtx::create(), DCtx::create()));
        f(c, d)
    })
}

impl Packed {
    /// The value's length as written.
    pub fn unpacked_len(&self) -> usize {
        match self {
            Packed::Raw(b) => b.len(),
            Packed::Zstd { len, .. } => *len as usize,
        }
    }

    /// The bytes this value takes in memory (its dictionary not counted: many values share it).
    pub fn memory(&self) -> usize {
        match self {
            Packed::Raw(b) => b.len(),
            Packed::Zstd { data, .. } => data.len(),
        }
    }

    /// The value as written.
    pub fn unpack(&self) -> Bytes {
        let (dictionary, data, len) = match self {
            Packed::Raw(b) => return b.clone(),
            Packed::Zstd { dictionary, data, len } => (dictionary, data, *len as usize),
        };
        let mut out = Vec::with_capacity(len);
        let done = with_contexts(|_, d| match dictionary {
            Some(dict) => d.decompress_using_dict(&mut out, data, dict),
            None => d.decompress(&mut out, data),
        });
        // Only bytes this module compressed, with the dictionary it compressed them with, ever
        // get here: a failure is a bug in it, not bad input.
        match done {
            Ok(n) if n == len => Bytes::from(out),
            other => panic!("a stored value does not decompress to its {len} bytes: {other:?}"),
        }
    }
}

/// The current dictionary of one kind.
struct Current {
    /// The samples, oldest first, one after the other.
    bytes: Arc<[u8]>,
    /// The length of each sample in `bytes`.
    samples: VecDeque<usize>,
    prepared: CDict<'static>,
    packed: u32,
}

/// Packs values, choosing each kind's dictionary.
#[derive(Default)]
pub struct Packer {
    kinds: HashMap<Box<str>, Current>,
}

/// The part of a store key that names its kind: up to its fourth `/` (`/registry/core/pods/`), or
/// its last one if it has fewer.
pub fn kind_of(key: &str) -> &str {
    let mut slashes = key.match_indices('/').map(|(i, _)| i);
    match slashes.nth(3).or_else(|| key.rfind('/')) {
        Some(i) => &key[..=i],
        None => "",
    }
}

impl Packer {
    /// Packs `value`, a value of `kind`.
    pub fn pack(&mut self, kind: &str, value: &Bytes) -> Packed {
        if value.len() < SMALLEST_PACKED || u32::try_from(value.len()).is_err() {
            return Packed::Raw(value.clone());
        }
        let mut samples = (Vec::new(), VecDeque::new());
        if let Some(current) = self.kinds.get_mut(kind) {
            current.packed = current.packed.saturating_add(1);
            let packed = compress(value, Some(current));
            let well = packed.as_ref().is_some_and(|p| p.len() * 10 <= value.len());
            if well || current.packed < DICTIONARY_TENURE || value.len() > LARGEST_SAMPLE {
                return finish(value, packed, Some(current.bytes.clone()));
            }
            // The value joins the dictionary, its oldest samples making room.
            let mut kept = current.samples.clone();
            let mut from = 0;
            while current.bytes.len() - from + value.len() > DICTIONARY_BYTES
                && let Some(oldest) = kept.pop_front()
            {
                from += oldest;
            }
            samples = (current.bytes[from..].to_vec(), kept);
        } else if value.len() > LARGEST_SAMPLE {
            return finish(value, compress(value, None), None);
        }
        let (mut bytes, mut lengths) = samples;
        bytes.extend_from_slice(value);
        lengths.push_back(value.len());
        let Some(prepared) = CDict::try_create(&bytes, LEVEL) else {
            return finish(value, compress(value, None), None);
        };
        let current = Current { bytes: Arc::from(bytes), samples: lengths, prepared, packed: 0 };
        let current = self.kinds.entry(kind.into()).insert_entry(current).into_mut();
        finish(value, compress(value, Some(current)), Some(current.bytes.clone()))
    }
}

/// `value` compressed (against `current`'s dictionary if given); `None` if zstd failed.
fn compress(value: &[u8], current: Option<&Current>) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(value.len()));
    let done = with_contexts(|c, _| match current {
        Some(cur) => c.compress_using_cdict(&mut out, value, &cur.prepared),
        None => c.compress(&mut out, value, LEVEL),
    });
    done.ok().map(|_| out)
}

/// The packed form of `value`: compressed if that saves at least an eighth, else as it is.
fn finish(value: &Bytes, packed: Option<Vec<u8>>, dictionary: Option<Arc<[u8]>>) -> Packed {
    match packed {
        Some(data) if data.len() < value.len() - value.len() / 8 => {
            Packed::Zstd { dictionary, data: data.into_boxed_slice(), len: value.len() as u32 }
        }
        _ => Packed::Raw(value.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str) -> Bytes {
        let managed: Vec<String> = (0..12).map(|i| format!(r#"{{"f:field{i}":{{}},"f:other{i}":{{".":{{}}}}}}"#)).collect();
        Bytes::from(format!(
            r#"{{"metadata":{{"name":"{name}","namespace":"default","labels":{{"app":"web"}},"managedFields":[{}]}},"spec":{{"nodeName":"{node}","containers":[{{"name":"c","image":"busybox"}}]}}}}"#,
            managed.join(",")
        ))
    }

    #[test]
    fn every_value_comes_back_as_it_was_written() {
        let mut p = Packer::default();
        let mut values = vec![Bytes::new(), Bytes::from_static(b"short"), Bytes::from(vec![7u8; 100_000])];
        values.extend((0..600).map(|i| pod(&format!("web-{i}"), &format!("node-{}", i % 7))));
        // Values unlike the kind's dictionary, past its tenure: they join it, pushing the oldest out.
        values.extend((0..50).map(|i| Bytes::from(format!("{i:>200}").repeat(3 + i % 5))));
        values.extend((0..10u8).map(|i| Bytes::from((0..=255u8).map(|b| b.wrapping_mul(31).wrapping_add(i)).collect::<Vec<_>>())));
        let packed: Vec<Packed> = values.iter().map(|v| p.pack("pods", v)).collect();
        for (v, pk) in values.iter().zip(&packed) {
            assert_eq!(&pk.unpack(), v);
            assert_eq!(pk.unpacked_len(), v.len());
        }
    }

    #[test]
    fn values_of_one_kind_pack_against_its_dictionary() {
        let mut p = Packer::default();
        let values: Vec<Bytes> = (0..100).map(|i| pod(&format!("web-{i}"), "node-1")).collect();
        let raw: usize = values.iter().map(Bytes::len).sum();
        let packed: usize = values.iter().map(|v| p.pack("pods", v).memory()).sum();
        assert!(packed * 10 < raw, "{packed} bytes packed from {raw}");
    }

    /// A pod as it runs: the pending pod's fields and a status unlike anything in them.
    fn running(name: &str) -> Bytes {
        let conditions: Vec<String> =
            ["Initialized", "Ready", "ContainersReady", "PodScheduled"].iter().map(|c| format!(r#"{{"type":"{c}","status":"True"}}"#)).collect();
        let pending = pod(name, "node-1");
        let status = format!(r#","status":{{"phase":"Running","conditions":[{}],"podIP":"10.0.0.9"}}}}"#, conditions.join(","));
        Bytes::from([&pending[..pending.len() - 1], status.as_bytes()].concat())
    }

    #[test]
    fn a_new_shape_of_a_kinds_values_joins_its_dictionary_and_the_old_shape_still_packs() {
        let mut p = Packer::default();
        let key = "pods";
        let packed = |p: &mut Packer, v: Bytes| (p.pack(key, &v).memory(), v.len());
        for i in 0..DICTIONARY_TENURE + 10 {
            packed(&mut p, pod(&format!("web-{i}"), "node-1"));
        }
        let first_running = packed(&mut p, running("web-a"));
        let (pending, raw) = (0..50).map(|i| packed(&mut p, pod(&format!("late-{i}"), "node-2"))).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert!(pending * 10 < raw, "pending pods after the change: {pending} bytes packed from {raw}");
        let (run, raw) = (0..50).map(|i| packed(&mut p, running(&format!("run-{i}")))).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
        assert!(run * 10 < raw, "running pods: {run} bytes packed from {raw}");
        assert!(first_running.0 * 10 < first_running.1, "the value that joined packs against itself: {first_running:?}");
    }

    #[test]
    fn a_kind_is_the_key_up_to_its_fourth_slash() {
        assert_eq!(kind_of("/registry/core/pods/default/web-0"), "/registry/core/pods/");
        assert_eq!(kind_of("/registry/core/nodes/n1"), "/registry/core/nodes/");
        assert_eq!(kind_of("/k/1"), "/k/");
        assert_eq!(kind_of("plain"), "");
    }
}
