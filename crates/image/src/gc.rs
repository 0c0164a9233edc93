//! Image garbage collection by disk usage, with kubelet's high and low thresholds.

use std::collections::HashSet;
use std::path::Path;

use crate::error::{ImageError, Result};
use crate::store::{ImageStore, lock};

/// What one garbage collection did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Collected {
    pub removed_images: Vec<String>,
    pub freed_bytes: u64,
}

impl ImageStore {
    /// Kubelet's image GC: when the disk is at or above `policy.high_percent` used, removes the
    /// least recently used images that no running container uses (`in_use`, normalized references)
    /// until usage would be at `policy.low_percent`.
    pub fn collect_garbage(&self, policy: GcPolicy, disk: DiskUsage, in_use: &HashSet<String>) -> Result<Collected> {
        let mut collected = Collected::default();
        if disk.capacity == 0 || disk.used_percent() < u64::from(policy.high_percent) {
            return Ok(collected);
        }
        let target_available = disk.capacity * u64::from(100 - policy.low_percent.min(100)) / 100;
        let to_free = target_available.saturating_sub(disk.available);
        let _records = lock(&self.records);
        let mut images = self.images()?;
        images.sort_by(|a, b| {
            a.last_used_ms
                .cmp(&b.last_used_ms)
                .then_with(|| a.reference.cmp(&b.reference))
        });
        for image in images {
            if collected.freed_bytes >= to_free {
                break;
            }
            if in_use.contains(&image.reference) {
                continue;
            }
            collected.freed_bytes += self.remove_locked(&image.reference)?;
            tracing::info!(image = %image.reference, "image garbage collection removed an unused image");
            collected.removed_images.push(image.reference);
        }
        if collected.freed_bytes < to_free {
            tracing::warn!(
                freed = collected.freed_bytes,
                wanted = to_free,
                "image garbage collection could not free enough space: the remaining images are in use"
            );
        }
        Ok(collected)
    }
}

/// Kubelet's `--image-gc-high-threshold` and `--image-gc-low-threshold` (percent of the disk used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GcPolicy {
    pub high_percent: u8,
    pub low_percent: u8,
}

impl Default for GcPolicy {
    fn default() -> Self {
        GcPolicy {
            high_percent: 85,
            low_percent: 80,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    pub capacity: u64,
    pub available: u64,
}

impl DiskUsage {
    /// The usage of the filesystem holding `path`.
    pub fn of(path: &Path) -> Result<Self> {
        let stat = rustix::fs::statvfs(path).map_err(|e| ImageError::io("measuring the disk of", path, e.into()))?;
        Ok(DiskUsage {
            capacity: stat.f_blocks * stat.f_frsize,
            available: stat.f_bavail * stat.f_frsize,
        })
    }

    fn used_percent(&self) -> u64 {
        100 - (self.available.min(self.capacity) * 100 / self.capacity)
    }
}
