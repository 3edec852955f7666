//! Event types shared by the eBPF programs and user space.
//!
//! Every event starts with an [`EventHeader`] (kind, schema version, size) so
//! that recordings made by one version can be read, or refused clearly, by another.
#![no_std]

pub mod event;
pub mod filter;
pub mod iface;
pub mod lookups;
pub mod ports;
pub mod sample;
pub mod scope;
pub mod socketlb;
pub mod wakeup;

pub use event::*;
pub use filter::*;
pub use iface::*;
pub use ports::*;
pub use sample::{
    SampleLevel, COUNTERS, COUNT_APART_LOST, COUNT_FOLLOWED, COUNT_LAPS, COUNT_LOST, COUNT_SHED,
    COUNT_STARTED,
};
pub use scope::*;
pub use wakeup::*;
