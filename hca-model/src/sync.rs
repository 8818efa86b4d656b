//! Locks that outlive a panic. A thread that panicked while holding one of the model's locks
//! (a bug, never a guest's doing) leaves its data as consistent as any other moment between
//! two of its statements, and the other guests' devices must go on: so a poisoned lock is
//! taken as it is, never unwrapped into a second panic.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// `lock` and `try_lock` that take a poisoned mutex as it is.
pub trait Unpoisoned<T: ?Sized> {
    /// Locks the mutex, poisoned or not.
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T>;
    /// Locks the mutex, poisoned or not, if no one holds it; None if someone does.
    fn try_lock_unpoisoned(&self) -> Option<MutexGuard<'_, T>>;
}

impl<T: ?Sized> Unpoisoned<T> for Mutex<T> {
    fn lock_unpoisoned(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_lock_unpoisoned(&self) -> Option<MutexGuard<'_, T>> {
        match self.try_lock() {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }
}

/// `read` and `write` that take a poisoned reader-writer lock as it is.
pub trait UnpoisonedRw<T: ?Sized> {
    /// Locks for reading, poisoned or not.
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T>;
    /// Locks for writing, poisoned or not.
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> UnpoisonedRw<T> for RwLock<T> {
    fn read_unpoisoned(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|e| e.into_inner())
    }
    fn write_unpoisoned(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|e| e.into_inner())
    }
}
