//! The shell's leaves, used by the store and by everything above it: which settings are
//! credentials and how they are shown ([`secret`]), and text cut to a bound or made safe for a
//! terminal ([`text`]). They depend on nothing of paddock's.

pub mod secret;
pub mod text;
