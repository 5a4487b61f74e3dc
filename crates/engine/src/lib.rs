//! TODO overview
#![deny(missing_docs)]
