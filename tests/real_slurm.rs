//! The end-to-end tests judged by a real Slurm 25.05 build (`REALSLURM_DIR`, see
//! `docs/slurm-local.md`): they skip and say why without one, and fail when the run requires it
//! (`SLINKY_TEST_REQUIRE=slurm`). One module per file.

mod slurm;
mod slurm_accounting;
mod slurm_client;
mod slurm_drain;
mod slurm_scheduled;
