//! NCCL's rings over an NVLink mesh without a switch.
//!
//! This says how many fit on the links among a node's first GPUs.
//!
//! On a switchless mesh (DGX-1's hybrid cube mesh) a GPU's links do not all lead to every other
//! GPU, so a ring's bandwidth is one link's, and a collective's is that times the number of
//! rings NCCL's search lays over the group's links (src/graph/search.cc: it tries direct NVLink
//! paths first, `PATH_NVL`, and only where none close a ring paths through one other GPU,
//! `PATH_NVB`). A link is full duplex: it carries one ring in each direction.

/// A directed link from one GPU to another.
type Link = (usize, usize);

/// One way round the group: the directed links its hops use, sorted (a relayed hop uses two).
type Ring = Vec<Link>;

/// Most GPUs in a mesh: switchless NVLink nodes have at most 8.
pub(crate) const MAX_MESH_GPUS: usize = 8;

/// Budgets of the search, which NCCL's own search has too (it stops at a time limit): the
/// rings listed and the packings tried. Within them the count is the most found, a lower
/// bound; DGX-1's mesh needs a few hundred of each.
const MAX_WAYS: usize = 100_000;
const MAX_PACKINGS: u64 = 1_000_000;

/// The most rings that fit on the links among GPUs `0..gpus` of `links` (`links[i][j]`:
/// NVLinks between GPU i and GPU j): direct hops where any ring of them exists, else hops
/// relayed through one other GPU of the group as well. 0 for fewer than two GPUs, or where no
/// ring exists even with relays.
pub(crate) fn rings(links: &[Vec<u32>], gpus: usize) -> u32 {
    if gpus < 2 {
        return 0;
    }
    [false, true]
        .into_iter()
        .map(|relays| pack(links, &ways_round(links, gpus, relays), gpus))
        .find(|&count| count > 0)
        .unwrap_or(0)
}

/// Every distinct ring over GPUs `0..gpus` that starts at GPU 0, each hop direct or, with
/// `relays`, through one other GPU of the group.
fn ways_round(links: &[Vec<u32>], gpus: usize, relays: bool) -> Vec<Ring> {
    let mut found = Vec::new();
    let mut visited = vec![false; gpus];
    visited[0] = true;
    extend(
        links,
        gpus,
        relays,
        0,
        &mut visited,
        &mut Vec::new(),
        &mut found,
    );
    for ring in &mut found {
        ring.sort_unstable();
    }
    found.sort();
    found.dedup();
    found
}

/// The ways `from` can pass data to `to`: directly, or (with `relays`, between GPUs without a
/// link of their own, as NCCL takes `PATH_NVB` only there) through a third GPU.
fn hops(links: &[Vec<u32>], gpus: usize, relays: bool, from: usize, to: usize) -> Vec<Vec<Link>> {
    let mut ways = Vec::new();
    if links[from][to] > 0 {
        ways.push(vec![(from, to)]);
    } else if relays {
        for via in (0..gpus).filter(|&v| v != from && v != to) {
            if links[from][via] > 0 && links[via][to] > 0 {
                ways.push(vec![(from, via), (via, to)]);
            }
        }
    }
    ways
}

fn extend(
    links: &[Vec<u32>],
    gpus: usize,
    relays: bool,
    at: usize,
    visited: &mut [bool],
    used: &mut Vec<Link>,
    found: &mut Vec<Ring>,
) {
    if found.len() >= MAX_WAYS {
        return;
    }
    let all_visited = visited.iter().all(|&v| v);
    let targets: Vec<usize> = match all_visited {
        true => vec![0],
        false => (0..gpus).filter(|&g| !visited[g]).collect(),
    };
    for to in targets {
        for hop in hops(links, gpus, relays, at, to) {
            let depth = used.len();
            used.extend(&hop);
            if all_visited {
                found.push(used.clone());
            } else {
                visited[to] = true;
                extend(links, gpus, relays, to, visited, used, found);
                visited[to] = false;
            }
            used.truncate(depth);
        }
    }
}

/// The most rings of `ways` (each usable more than once) whose links fit the capacities.
fn pack(links: &[Vec<u32>], ways: &[Ring], gpus: usize) -> u32 {
    let mut spare: Vec<Vec<u32>> = links.iter().map(|row| row.to_vec()).collect();
    let mut best = 0;
    let mut tried = 0;
    search(ways, 0, 0, gpus, &mut spare, &mut best, &mut tried);
    best
}

/// Every ring leaves and enters each GPU once: no more rings fit than the fewest spare
/// outgoing or incoming links of a GPU.
fn bound(spare: &[Vec<u32>], gpus: usize) -> u32 {
    (0..gpus)
        .map(|g| {
            let out: u32 = spare[g][..gpus].iter().sum();
            let into: u32 = spare[..gpus].iter().map(|row| row[g]).sum();
            out.min(into)
        })
        .min()
        .unwrap_or(0)
}

fn search(
    ways: &[Ring],
    first: usize,
    count: u32,
    gpus: usize,
    spare: &mut [Vec<u32>],
    best: &mut u32,
    tried: &mut u64,
) {
    *best = (*best).max(count);
    *tried += 1;
    if *tried > MAX_PACKINGS || count + bound(spare, gpus) <= *best {
        return;
    }
    for (i, ring) in ways.iter().enumerate().skip(first) {
        if !fits(ring, spare) {
            continue;
        }
        for &(a, b) in ring {
            spare[a][b] -= 1;
        }
        search(ways, i, count + 1, gpus, spare, best, tried);
        for &(a, b) in ring {
            spare[a][b] += 1;
        }
    }
}

/// Whether the spare links carry `ring` (which may use one link twice through a relay).
fn fits(ring: &Ring, spare: &[Vec<u32>]) -> bool {
    ring.chunk_by(|x, y| x == y)
        .all(|same| spare[same[0].0][same[0].1] as usize >= same.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DGX-1's hybrid cube mesh (V100): GPUs 0–3 and 4–7 each fully connected, one or two
    /// links per pair, and each GPU tied to its twin in the other half by two links.
    fn dgx1() -> Vec<Vec<u32>> {
        vec![
            vec![0, 1, 1, 2, 2, 0, 0, 0],
            vec![1, 0, 2, 1, 0, 2, 0, 0],
            vec![1, 2, 0, 2, 0, 0, 1, 0],
            vec![2, 1, 2, 0, 0, 0, 0, 1],
            vec![2, 0, 0, 0, 0, 1, 1, 2],
            vec![0, 2, 0, 0, 1, 0, 2, 1],
            vec![0, 0, 1, 0, 1, 2, 0, 2],
            vec![0, 0, 0, 1, 2, 1, 2, 0],
        ]
    }

    #[test]
    fn dgx1_groups_get_the_rings_their_links_allow() {
        let mesh = dgx1();
        let counts: Vec<u32> = (0..=8).map(|g| rings(&mesh, g)).collect();
        // Two GPUs share one link (one ring each way round it); three, a triangle with a
        // single link; a quad, four links per GPU; six, GPU 4 reaches only 0 and 5 (one
        // link); the whole node, all six links of every GPU.
        assert_eq!(counts[..5], [0, 0, 1, 2, 4]);
        assert_eq!(counts[6], 2);
        assert_eq!(counts[8], 6);
        // Five: GPU 4's only neighbour is GPU 0, so rings relay through it, two of them on
        // the two links between 0 and 4.
        assert_eq!(counts[5], 2);
        assert!(counts[7] >= 4, "{counts:?}");
    }

    /// `gpus` GPUs, every pair joined by one link.
    fn complete(gpus: usize) -> Vec<Vec<u32>> {
        (0..gpus)
            .map(|i| (0..gpus).map(|j| u32::from(i != j)).collect())
            .collect()
    }

    #[test]
    fn every_link_of_a_complete_mesh_carries_a_ring_and_a_relay_uses_its_two() {
        // Seven GPUs joined pairwise: three undirected Hamiltonian cycles, each run both ways.
        assert_eq!(rings(&complete(7), 7), 6);
        // An eighth GPU tied to GPU 0 only: every ring enters and leaves it over that one link.
        let mut links = complete(7);
        for row in &mut links {
            row.push(0);
        }
        links[0][7] = 1;
        links.push((0..8).map(|j| u32::from(j == 0)).collect());
        assert_eq!(rings(&links, 8), 1);
    }

    #[test]
    fn a_full_duplex_pair_is_one_ring_and_a_broken_chain_none() {
        assert_eq!(rings(&[vec![0, 3], vec![3, 0]], 2), 3);
        let chain = vec![vec![0, 1, 0], vec![1, 0, 0], vec![0, 0, 0]];
        assert_eq!(rings(&chain, 3), 0);
    }
}
