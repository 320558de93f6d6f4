//! The bit-exact CPU reference of every kernel (being written).
