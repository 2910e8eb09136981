//! The gemini bridge (being written).

use super::Bridge;

pub fn run(bridge: &Bridge) -> Result<(), String> {
    let _ = bridge;
    Err("the gemini bridge is not written yet".into())
}
