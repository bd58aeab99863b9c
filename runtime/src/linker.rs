//! What a component is linked with: WASI (granting nothing: see [`crate::sandbox`]) and the
//! contract's `log` import, whose lines go into the call's bounded log.

use wasmtime::component::Linker;

use crate::{
    PluginError, bindings::slinky::builder0_3_0::log as wit_log, guest_log::Level, sandbox::CallState,
};

/// The linker every component of `engine` is instantiated through: WASI (granting nothing, see
/// [`crate::sandbox::instantiate`]) and the contract's `log` import. Built once per engine.
///
/// # Errors
/// [`PluginError::Engine`] when WASI cannot be linked.
pub(crate) fn linker(engine: &wasmtime::Engine) -> Result<Linker<CallState>, PluginError> {
    let mut linker: Linker<CallState> = Linker::new(engine);
    wasmtime_wasi::p2::add_to_linker_sync(&mut linker)
        .map_err(|e| PluginError::Engine(format!("cannot link WASI: {e:#}")))?;
    add_log_to_linker(&mut linker)
        .map_err(|e| PluginError::Engine(format!("cannot link the log import: {e:#}")))?;
    Ok(linker)
}

/// The contract's `log` import (0.3.0 on): the guest's lines go into the call's bounded log.
impl wit_log::Host for CallState {
    fn log(&mut self, level: wit_log::Level, message: String) {
        use wit_log::Level as W;
        let level = match level {
            W::Trace => Level::Trace,
            W::Debug => Level::Debug,
            W::Info => Level::Info,
            W::Warn => Level::Warn,
            W::Error => Level::Error,
        };
        self.log.push(level, message);
    }
}

/// Link the `log` import.
///
/// # Errors
/// What the linker says (a name defined twice).
fn add_log_to_linker(linker: &mut Linker<CallState>) -> wasmtime::Result<()> {
    wit_log::add_to_linker::<CallState, wasmtime::component::HasSelf<CallState>>(linker, |s| s)
}
