//! Shepherd's object model: the kinds it serves, validation and defaulting, label and field
//! selectors, and API errors as Kubernetes `Status` objects.

pub mod error;
pub mod kinds;

pub use error::{ApiError, Cause};
pub use kinds::ResourceInfo;
