//! The agent's API for cluster views, generated from
//! proto/dnstrace/v1/observer.proto: the agent serves it, `dnstrace
//! cluster` calls it.
#![allow(clippy::all, clippy::pedantic)]
tonic::include_proto!("dnstrace.v1");
