//! (in progress: issue 3) Megatron's DynamicGradScaler as a no_std state machine.
