//! paddock's operating-system seam, below the daemon and the runner (ARCHITECTURE.md):
//! processes spawned in their own group with the parent-death signal and the containment tag
//! and ended as a tree ([`proc`], [`contain`]), Unix sockets bound privately ([`socket`]), the
//! gRPC transport over them ([`transport`]), the clocks and default paths ([`paths`]), and
//! files read only inside a root, bounded ([`confined`]).
//! Nothing here knows a session, a run or a protocol's rules.

mod born;
pub mod confined;
pub mod contain;
pub mod paths;
pub mod proc;
pub mod socket;
pub mod transport;
pub use paddock_support::text;
