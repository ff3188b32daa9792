//! The issuer's second duty (#51): each `Grant` gets its boundary and credential
//! ([`plan`] decides, [`run`] writes).

mod index;
pub mod plan;
pub mod rbac;
mod run;

pub use run::run;
