//! The commands: each wires the layers below for one thing a user asks.
pub mod agent;
pub mod check;
pub mod cluster;
mod exit;
pub mod observer;
pub mod pods;
mod ready;
pub mod replay;
pub mod report;
mod show;
pub mod trace;

pub use show::Show;
