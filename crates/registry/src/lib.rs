//! An OCI distribution registry (push and pull) over a directory, and a builder of test images.

mod error;
pub mod name;
mod server;
mod storage;
pub mod testimage;

pub use error::{ErrorCode, RegistryError};
pub use server::{DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, OCI_INDEX, OCI_MANIFEST, Registry, serve};
