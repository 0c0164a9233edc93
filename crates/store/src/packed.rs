//! Object values as the state keeps them between writes: compressed with zstd against a
//! dictionary per kind.
//!
//! The objects of one kind are mostly the same JSON: the same field names, the same
//! `managedFields`, often the same template. One stored value of the kind, used as a raw-content
//! dictionary, lets zstd write the others as little more than what differs (a 3.8 KB pod of a
//! Deployment packs into about a hundred bytes; zstd alone gets about a third). The kind is the
//! key up to its second `/` after the first character (`/registry/pods/`).
//!
//! A kind's dictionary is its first value that is neither tiny nor huge. When values stop
//! resembling it (a value does not shrink to half), and enough values were packed against it, the
//! next such value becomes the dictionary; values packed before keep the dictionary they were
//! packed with alive (its bytes only: the prepared compression tables are kept for the current
//! one).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use zstd_safe::{CCtx, CDict, DCtx};

/// Values shorter than this are kept as they are.
const SMALLEST_PACKED: usize = 64;
/// Largest value that becomes a dictionary: a dictionary's prepared tables cost memory, and a
/// huge value is rarely like the others.
const LARGEST_DICTIONARY: usize = 16 * 1024;
/// Values a dictionary packs before a value unlike it may replace it.
const DICTIONARY_TENURE: u32 = 256;
/// zstd's level: its fastest, which with a dictionary compresses about as well as the next ones.
const LEVEL: i32 = 1;

/// One stored value, packed or not.
#[derive(Clone)]
pub(crate) enum Packed {
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
    pub(crate) fn len(&self) -> usize {
        match self {
            Packed::Raw(b) => b.len(),
            Packed::Zstd { len, .. } => *len as usize,
        }
    }

    /// The bytes this value takes in memory (its dictionary not counted: many values share it).
    pub(crate) fn memory(&self) -> usize {
        match self {
            Packed::Raw(b) => b.len(),
            Packed::Zstd { data, .. } => data.len(),
        }
    }

    /// The value as written.
    pub(crate) fn unpack(&self) -> Bytes {
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
    bytes: Arc<[u8]>,
    prepared: CDict<'static>,
    packed: u32,
}

/// Packs values, choosing each kind's dictionary.
#[derive(Default)]
pub(crate) struct Packer {
    kinds: HashMap<Box<str>, Current>,
}

/// The part of `key` that names its kind: up to its second `/` after the first character.
fn kind_of(key: &str) -> &str {
    let mut slashes = key.char_indices().skip(1).filter(|(_, c)| *c == '/');
    match slashes.nth(1) {
        Some((i, _)) => &key[..=i],
        None => "",
    }
}

impl Packer {
    /// Packs `value`, written under `key`.
    pub(crate) fn pack(&mut self, key: &str, value: &Bytes) -> Packed {
        if value.len() < SMALLEST_PACKED || u32::try_from(value.len()).is_err() {
            return Packed::Raw(value.clone());
        }
        let kind = kind_of(key);
        if let Some(current) = self.kinds.get_mut(kind) {
            current.packed = current.packed.saturating_add(1);
            let packed = compress(value, Some(current));
            let alike = packed.as_ref().is_some_and(|p| p.len() * 2 <= value.len());
            if alike || current.packed < DICTIONARY_TENURE || value.len() > LARGEST_DICTIONARY {
                return finish(value, packed, Some(current.bytes.clone()));
            }
        }
        // The kind's first value, or one unlike its dictionary: it becomes the dictionary.
        if value.len() > LARGEST_DICTIONARY {
            return finish(value, compress(value, None), None);
        }
        let Some(prepared) = CDict::try_create(value, LEVEL) else {
            return finish(value, compress(value, None), None);
        };
        let current = Current { bytes: Arc::from(&value[..]), prepared, packed: 0 };
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
        // Values unlike the kind's dictionary, past its tenure: they replace it.
        values.extend((0..50).map(|i| Bytes::from(format!("{i:>200}").repeat(3 + i % 5))));
        values.extend((0..10u8).map(|i| Bytes::from((0..=255u8).map(|b| b.wrapping_mul(31).wrapping_add(i)).collect::<Vec<_>>())));
        let packed: Vec<Packed> = values.iter().enumerate().map(|(i, v)| p.pack(&format!("/registry/pods/ns/{i}"), v)).collect();
        for (v, pk) in values.iter().zip(&packed) {
            assert_eq!(&pk.unpack(), v);
            assert_eq!(pk.len(), v.len());
        }
    }

    #[test]
    fn values_of_one_kind_pack_against_its_dictionary() {
        let mut p = Packer::default();
        let values: Vec<Bytes> = (0..100).map(|i| pod(&format!("web-{i}"), "node-1")).collect();
        let raw: usize = values.iter().map(Bytes::len).sum();
        let packed: usize = values.iter().map(|v| p.pack("/registry/pods/default/x", v).memory()).sum();
        assert!(packed * 10 < raw, "{packed} bytes packed from {raw}");
    }

    #[test]
    fn a_kind_is_the_key_up_to_its_second_slash() {
        assert_eq!(kind_of("/registry/pods/default/web-0"), "/registry/pods/");
        assert_eq!(kind_of("/registry/nodes/n1"), "/registry/nodes/");
        assert_eq!(kind_of("plain"), "");
        assert_eq!(kind_of("/a"), "");
    }
}
