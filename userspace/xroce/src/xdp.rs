//! XDP program loader (filled in by the foundation work).
