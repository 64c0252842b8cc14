//! Unit tests of the lowering's shape arithmetic.

use super::broadcast;
use super::shape::{canonical_permute, reshape};

#[test]
fn permutations_lose_unit_axes_and_merge_neighbours() {
    assert_eq!(
        canonical_permute(&[2, 3, 4, 5], &[0, 2, 1, 3]),
        (vec![2, 3, 4, 5], vec![0, 2, 1, 3])
    );
    // [2,1,4] by [1,0,2]: only a unit axis moves.
    assert_eq!(
        canonical_permute(&[2, 1, 4], &[1, 0, 2]),
        (vec![8], vec![0])
    );
    // [2,3,4,5] by [0,1,3,2]: the first two axes stay together.
    assert_eq!(
        canonical_permute(&[2, 3, 4, 5], &[0, 1, 3, 2]),
        (vec![6, 4, 5], vec![0, 2, 1])
    );
    assert_eq!(
        canonical_permute(&[2, 3, 4], &[2, 0, 1]),
        (vec![6, 4], vec![1, 0])
    );
}

#[test]
fn reshape_infers_and_copies() {
    assert_eq!(reshape(&[2, 3, 4], &[0, -1], false).unwrap(), vec![2, 12]);
    assert_eq!(reshape(&[2, 3, 4], &[4, 6], false).unwrap(), vec![4, 6]);
    assert!(reshape(&[2, 3, 4], &[5, -1], false).is_err());
    assert!(reshape(&[2, 3, 4], &[-1, -1], false).is_err());
}

#[test]
fn broadcasting_follows_numpy() {
    assert_eq!(broadcast(&[2, 3, 4], &[4], "t").unwrap(), vec![2, 3, 4]);
    assert_eq!(
        broadcast(&[2, 1, 4], &[1, 3, 1], "t").unwrap(),
        vec![2, 3, 4]
    );
    assert!(broadcast(&[2, 3], &[3, 2], "t").is_err());
}
