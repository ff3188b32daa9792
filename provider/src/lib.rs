//! kbind's provider side: the programs a provider runs beside the APIs it serves. None of them
//! syncs; each acts only through the provider's API server, on evidence kbind wrote there.
#![forbid(unsafe_code)]

pub mod bundle;
pub mod catalog;
pub mod clock;
pub mod gateway;
pub mod issuer;
pub mod reaper;
pub mod status;
