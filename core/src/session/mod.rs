//! The session machine: its inputs, its effects, its transition table and the machine itself.

pub mod effect;
pub mod input;
pub mod machine;
pub mod table;
