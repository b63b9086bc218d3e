//! Arrays and MLX's ops through the bindings: dtypes, typed errors, and
//! each family of ops against plain references. One test binary (each
//! links libmlx); the modules share nothing but the helpers.

#[path = "../common/mod.rs"]
mod common;

mod dtypes;
mod elementwise;
mod errors;
mod fast_random;
mod linalg_quant;
mod reduce;
mod shape;
