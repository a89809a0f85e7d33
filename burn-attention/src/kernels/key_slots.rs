//! Which keys each block of queries scores: the pattern a sparse attention hands to
//! [`gathered_attention`](crate::engines::gathered_softmax::gathered_attention), built on the host.

/// Which keys each block of queries scores, built on the host by a pattern.
///
/// `index` and `mask` are laid out per *group*: one group shared by every batch element and head
/// (a fixed pattern without padding), one per batch element (padding), or one per batch element
/// and head (patterns drawn per head, or computed from the data).
#[derive(Debug, Clone)]
pub struct KeySlots {
    /// Queries per block.
    pub block: usize,
    /// Number of query blocks (`n_blocks · block >= n_q`; rows past `n_q` are dropped).
    pub n_blocks: usize,
    /// Keys scored by each block.
    pub slots: usize,
    /// `[batch_groups, head_groups]`, each 1 or the full size.
    pub groups: [usize; 2],
    /// Key position of each slot, `[groups, n_blocks, slots]` flattened; a masked slot may hold
    /// any valid position.
    pub index: Vec<i64>,
    /// `true` = query `r` of block `β` does not see slot `s`: `[groups, n_blocks, block, slots]`
    /// flattened.
    pub mask: Vec<bool>,
    /// Added to the scores before the softmax, `[groups, n_blocks, block, slots]` (Reformer's
    /// correction for keys met in several hash rounds); none for most patterns.
    pub bias: Option<Vec<f32>>,
    /// The query position at each row of the blocks, `[groups, n_blocks · block]`, a
    /// permutation of `0..n_blocks · block` (positions past `n_q` are padding rows), for patterns
    /// whose blocks are not runs of consecutive queries (a strided pattern's residue classes,
    /// Reformer's buckets); `None`: row `r` is query `r`.
    pub query_order: Option<Vec<i64>>,
}

impl KeySlots {
    /// Empty slots for `n_blocks` blocks of `block` queries scoring `slots` keys each: every
    /// slot masked and pointing at position 0, for the pattern to fill in.
    pub fn masked(groups: [usize; 2], n_blocks: usize, block: usize, slots: usize) -> Self {
        let g = groups[0] * groups[1];
        Self {
            block,
            n_blocks,
            slots,
            groups,
            index: vec![0; g * n_blocks * slots],
            mask: vec![true; g * n_blocks * block * slots],
            bias: None,
            query_order: None,
        }
    }

    /// Each query `i` sees the keys `j` with `i - before <= j <= i + after`, and the keys at
    /// `globals` (sorted, distinct), in blocks of `block` queries; one group per batch element,
    /// its padded keys (`padding[b][j]`) masked. A block scores the `block + before + after`
    /// positions around it, then the global positions (masked in the band, so that none is
    /// counted twice).
    pub fn band(
        n: usize,
        block: usize,
        [before, after]: [usize; 2],
        globals: &[usize],
        padding: &[Vec<bool>],
    ) -> Self {
        let block = block.clamp(1, n.max(1));
        // A band reaching past either end of the sequence holds nothing there: no slots for it.
        let (before, after) = (before.min(n), after.min(n));
        let n_blocks = n.div_ceil(block);
        let width = block + before + after;
        let mut slots = Self::masked([padding.len(), 1], n_blocks, block, width + globals.len());
        for (g, pad) in padding.iter().enumerate() {
            for beta in 0..n_blocks {
                let first = beta * block;
                for s in 0..width {
                    // Slot s holds position first - before + s.
                    let Some(j) = (first + s).checked_sub(before) else {
                        continue;
                    };
                    if j < n && !pad[j] && globals.binary_search(&j).is_err() {
                        slots.set(g, beta, s, j, |r| {
                            let i = first + r;
                            j + before >= i && j <= i + after
                        });
                    }
                }
                for (t, &j) in globals.iter().enumerate() {
                    if j < n && !pad[j] {
                        slots.set(g, beta, width + t, j, |_| true);
                    }
                }
            }
        }
        slots
    }

    /// Offset of group `(batch, head)` (each taken modulo its group count) in `index`, in
    /// slots.
    pub fn group(&self, batch: usize, head: usize) -> usize {
        (batch % self.groups[0]) * self.groups[1] + head % self.groups[1]
    }

    /// Sets slot `s` of block `beta` in group `g` to key position `pos`, seen by the queries
    /// `r` of the block for which `sees(r)`.
    pub fn set(
        &mut self,
        g: usize,
        beta: usize,
        s: usize,
        pos: usize,
        sees: impl Fn(usize) -> bool,
    ) {
        self.index[(g * self.n_blocks + beta) * self.slots + s] = pos as i64;
        for r in 0..self.block {
            let at = self.pair(g, beta, r, s);
            self.mask[at] = !sees(r);
        }
    }

    /// Offset of (query `r` of block `beta`, slot `s`) of group `g` in `mask` and `bias`.
    pub fn pair(&self, g: usize, beta: usize, r: usize, s: usize) -> usize {
        ((g * self.n_blocks + beta) * self.block + r) * self.slots + s
    }

    /// The offsets in `mask` and `bias` of every (query, slot) pair of block `beta` of group
    /// `g`, query by query (read by the `flex` kernels).
    #[cfg_attr(not(feature = "flex"), allow(dead_code))]
    pub fn block_pairs(&self, g: usize, beta: usize) -> std::ops::Range<usize> {
        let first = self.pair(g, beta, 0, 0);
        first..first + self.block * self.slots
    }

    /// Also masks the pairs an arbitrary attention mask hides: `attn` is `[batch, n_q, n_k]`
    /// flattened (`true` = query `i` does not see key `j`). Slots shared by every batch element
    /// are first given one group per batch element.
    pub fn mask_attention(&mut self, attn: &[bool], [batch, n_q, n_k]: [usize; 3]) {
        if self.groups[0] == 1 && batch > 1 {
            self.per_batch(batch);
        }
        let hidden: Vec<usize> = self
            .pairs(self.groups, n_q)
            .filter(|p| attn[(p.group[0] * n_q + p.query) * n_k + p.key])
            .map(|p| p.at)
            .collect();
        for at in hidden {
            self.mask[at] = true;
        }
    }

    /// Marks in `kept` (`[batch, heads, n_q, n_k]` flattened) the pairs these slots let a query
    /// see: the pattern as a dense mask, for forming its weights.
    pub fn mark_kept(&self, kept: &mut [bool], [batch, heads, n_q, n_k]: [usize; 4]) {
        for p in self.pairs([batch, heads], n_q) {
            if !self.mask[p.at] {
                let [b, h] = p.group;
                kept[((b * heads + h) * n_q + p.query) * n_k + p.key] = true;
            }
        }
    }

    /// Every (query, slot) pair of the batch elements and heads `0..batch`, `0..heads` (their
    /// groups' slots), for the queries below `n_q` (rows past it pad the last block).
    fn pairs(&self, [batch, heads]: [usize; 2], n_q: usize) -> impl Iterator<Item = Pair> + '_ {
        let rows = self.n_blocks * self.block;
        let blocks = (0..batch).flat_map(move |b| {
            (0..heads).flat_map(move |h| (0..self.n_blocks).map(move |beta| ([b, h], beta)))
        });
        blocks.flat_map(move |(group, beta)| {
            let g = self.group(group[0], group[1]);
            (0..self.block).flat_map(move |r| {
                let row = beta * self.block + r;
                let query = match &self.query_order {
                    Some(order) => order[g * rows + row] as usize,
                    None => row,
                };
                (0..self.slots)
                    .filter(move |_| query < n_q)
                    .map(move |s| Pair {
                        group,
                        query,
                        key: self.index[(g * self.n_blocks + beta) * self.slots + s] as usize,
                        at: self.pair(g, beta, r, s),
                    })
            })
        })
    }

    /// The same slots with one group per batch element (`batch` copies of each head group).
    fn per_batch(&mut self, batch: usize) {
        self.index = repeat(&self.index, batch);
        self.mask = repeat(&self.mask, batch);
        self.bias = self.bias.as_ref().map(|b| repeat(b, batch));
        self.query_order = self.query_order.as_ref().map(|o| repeat(o, batch));
        self.groups[0] = batch;
    }
}

/// One (query, slot) pair of [`KeySlots`]: the batch element and head it is read for, the query
/// and key positions, and its offset in `mask` and `bias`.
struct Pair {
    group: [usize; 2],
    query: usize,
    key: usize,
    at: usize,
}

/// `times` copies of `values`, one after another.
fn repeat<T: Clone>(values: &[T], times: usize) -> Vec<T> {
    (0..times).flat_map(|_| values.iter().cloned()).collect()
}
