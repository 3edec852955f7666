//! Correlation: decoded DNS packets, seen at many hooks, become journeys.
//!
//! A journey is one query from one client socket (client address, DNS id,
//! question) followed across every place it was seen, through DNAT, to the
//! server and back, until the answer reaches the client, the kernel drops it,
//! or it times out. Queries a server sends while a journey waits there, for
//! the same question, are its upstream journeys. The engine is pure: records
//! in, journeys out, time only from the records and `tick`.
//!
//! The engine is in `engine`; what it hands on is in `journey`, the
//! journeys it follows in `open`, how it finds them in `index` (over `table`'s maps),
//! and what it remembers besides in `lookups`, `devices`, `connections`
//! and `sampling`.
mod connections;
mod devices;
mod engine;
mod index;
mod journey;
mod lookups;
mod open;
mod sampling;
mod table;

pub use connections::{Connection, Reset};
pub use engine::{Engine, Limits, CLOSE_BATCH};
#[cfg(test)]
pub use journey::fixtures;
pub use journey::{FragmentNote, Gap, Journey, Leg, Outcome};
