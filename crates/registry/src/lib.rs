//! An OCI distribution registry (push and pull) over a directory, and a builder of test images.

mod blobs;
mod error;
mod manifests;
pub mod name;
mod server;
mod storage;
pub mod testimage;
mod uploads;

pub use error::{ErrorCode, RegistryError};
pub use manifests::{DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, OCI_INDEX, OCI_MANIFEST};
pub use server::{Registry, serve};
