pub mod delivery;
