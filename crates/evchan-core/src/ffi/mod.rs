//! The one module tree of evchan-core that calls C.
//!
//! # Safety
//!
//! Every `unsafe` block of the crate lives below this module. Each block carries a `// SAFETY:`
//! comment and each `unsafe fn` a `# Safety` section. The handle types defined here are sound
//! on their own: their lifetimes encode the destruction order libibverbs and librdmacm require,
//! so the safe modules above can only misuse them in ways the borrow checker rejects.
#![allow(unsafe_code)]

pub(crate) mod verbs;
