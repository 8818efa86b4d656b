//! The `hcabench` library side: the KVM backend (a rust-vmm VMM hosting the HCA model in
//! process), shared by the command line and its tests.

pub mod kvm;
pub mod kvm_guests;
