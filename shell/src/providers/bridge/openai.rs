//! The openai bridge (being written).

use super::Bridge;

pub fn run(bridge: &Bridge) -> Result<(), String> {
    let _ = bridge;
    Err("the openai bridge is not written yet".into())
}
