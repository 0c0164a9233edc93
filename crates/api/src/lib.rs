//! Shepherd's object model: the kinds it serves, validation and defaulting, label and field
//! selectors, and API errors as Kubernetes `Status` objects.

pub mod age;
mod config_validation;
pub mod cron;
pub mod defaults;
pub mod digest;
pub mod duration;
pub mod error;
#[doc(hidden)]
pub mod fixtures;
pub mod json;
pub mod kinds;
pub mod meta;
pub mod pod;
pub mod quantity;
pub mod selector;
pub mod validation;
mod volume_validation;

pub use age::human_age;
pub use error::{ApiError, Cause};
pub use json::{JsonPath, array_at, bool_at, i64_at, int_at, map_at, opt_str_at, str_at, strings_at};
pub use kinds::ResourceInfo;
pub use selector::{FieldSelector, LabelSelector};
pub use volume_validation::is_env_var_name;
