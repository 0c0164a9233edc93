//! OCI images for Shepherd's nodes: a verified blob store, registry pulls, layer unpacking and overlay roots.

mod digest;
mod error;
mod gc;
mod import;
mod mirrors;
mod overlay;
mod policy;
mod pull;
mod reference;
mod singleflight;
mod store;
mod unpack;

pub use digest::Digest;
pub use error::{ImageError, Result};
pub use gc::{Collected, DiskUsage, GcPolicy};
pub use import::import;
pub use mirrors::{Endpoint, RegistriesConfig};
pub use policy::{PullDecision, PullPolicy};
pub use pull::{Credentials, Ensured, Puller};
pub use reference::ImageRef;
pub use store::{BlobWriter, ImageRecord, ImageStore, LayerRecord, Pin};
