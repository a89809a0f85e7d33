//! The Pathfinder image generator: two target "snakes" (paths of short dashes, the paddles)
//! grown side by side from seeds a fixed distance apart, short distractor snakes around them,
//! and two round markers; the label says whether both markers sit on the same snake.
//!
//! The procedure follows the published generator (Linsley et al. 2018, the `snakes2` script,
//! MIT-licensed, with the parameters of LRA's `data/pathfinder.py`), written afresh here:
//! - a snake's first paddle is seeded at a free pixel with a random whole-degree orientation;
//!   each next paddle starts `margin` past a pivot placed `margin` beyond the previous paddle's
//!   end, its far end drawn from the pixels on the circle of radius `length + margin` around
//!   the pivot, weighted by `cos(min(continuity · turn, 90°))²` and by how free the pixel is;
//! - a paddle is kept only if its footprint (the dash widened by `margin`) overlaps no earlier
//!   paddle but the snake's own previous one (`max(occupied + footprint) < 1.8`); a target pair
//!   that cannot be completed is redrawn, a distractor retried 4 times, then left out;
//! - the two targets start `seed_distance` apart, away from the borders by twice that distance;
//!   the markers are discs at the first paddle of one target and the last paddle of the same
//!   target (label 1) or of the other (label 0);
//! - intensities: dashes `paddle_contrast · snake_contrast` (targets) or `snake_contrast`
//!   (distractors), markers 1, then the image divided by its maximum.
//!
//! Two choices differ from the script: shapes are antialiased by area (a `4 · antialias`
//! sub-sample grid per pixel, a box filter) where the script draws at `antialias` times the size
//! and resamples with Lanczos; and labels alternate (exactly balanced) where the script flips a
//! coin per image.

use std::f32::consts::PI;

use crate::rng::Rng;

/// The generator's parameters for one resolution (LRA's `data/pathfinder.py`).
#[derive(Debug, Clone, PartialEq)]
pub struct SnakeParams {
    /// Image side, in pixels.
    pub size: usize,
    /// Border, in pixels, no paddle may cover.
    pub padding: usize,
    /// Paddle (dash) length.
    pub paddle_length: usize,
    /// Paddle thickness.
    pub paddle_thickness: f32,
    /// Gap parameter between paddles; one is drawn per image.
    pub paddle_margins: &'static [usize],
    /// Marker radius.
    pub marker_radius: f32,
    /// Distance between the two target snakes' seeds.
    pub seed_distance: usize,
    /// How sharply a snake may turn (larger: straighter).
    pub continuity: f32,
    /// Antialiasing scale.
    pub antialias: usize,
    /// Intensity of distractor paddles, and factor of the targets'.
    pub snake_contrast: f32,
    /// Second factor of the target paddles' intensity.
    pub paddle_contrast: f32,
    /// Paddles shared among distractor snakes: `budget / distractor_length` snakes.
    pub distractor_budget: usize,
    /// Whether that count is taken with integer division (the 32-pixel script's `//`) or, as the
    /// 64- and 128-pixel scripts' float division and loop do, rounded up.
    pub distractor_floor: bool,
}

impl SnakeParams {
    /// The parameters LRA generated its data with, by image side (32, 64 or 128).
    pub fn lra(size: usize) -> Option<Self> {
        Some(match size {
            32 => Self {
                size,
                padding: 1,
                paddle_length: 2,
                paddle_thickness: 0.5,
                paddle_margins: &[1],
                marker_radius: 1.5,
                seed_distance: 7,
                continuity: 1.0,
                antialias: 2,
                snake_contrast: 2.0,
                paddle_contrast: 0.75,
                distractor_budget: 20,
                distractor_floor: true,
            },
            64 => Self {
                size,
                padding: 1,
                paddle_length: 5,
                paddle_thickness: 1.0,
                paddle_margins: &[1],
                marker_radius: 2.5,
                seed_distance: 12,
                continuity: 1.8,
                antialias: 2,
                snake_contrast: 0.8,
                paddle_contrast: 1.0,
                distractor_budget: 22,
                distractor_floor: false,
            },
            128 => Self {
                size,
                padding: 1,
                paddle_length: 5,
                paddle_thickness: 1.5,
                paddle_margins: &[2, 3],
                marker_radius: 3.0,
                seed_distance: 20,
                continuity: 1.8,
                antialias: 2,
                snake_contrast: 0.9,
                paddle_contrast: 1.0,
                distractor_budget: 35,
                distractor_floor: false,
            },
            _ => return None,
        })
    }

    /// Paddles per distractor snake for targets of `contour_length` paddles.
    pub fn distractor_length(&self, contour_length: usize) -> usize {
        (contour_length / 3).max(1)
    }

    /// Distractor snakes for targets of `contour_length` paddles.
    pub fn distractor_count(&self, contour_length: usize) -> usize {
        if self.distractor_floor {
            self.distractor_budget / self.distractor_length(contour_length)
        } else {
            (self.distractor_budget as f32 * 3.0 / contour_length as f32).ceil() as usize
        }
    }
}

/// Retries of one paddle (the script's `max_paddle_retrial`).
const PADDLE_TRIALS: usize = 3;
/// Tries of one distractor snake (1 + the script's `max_distractor_contour_retrial`).
const DISTRACTOR_TRIALS: usize = 5;
/// Redraws of a target pair before giving up on the image's parameters.
const PAIR_TRIALS: usize = 10_000;

/// One generated image: grey values row by row, and its label (1: the markers are joined).
#[derive(Debug, Clone, PartialEq)]
pub struct PathfinderImage {
    /// `size · size` grey values.
    pub pixels: Vec<u8>,
    /// 1 when both markers sit on the same snake.
    pub label: usize,
    /// The paddle margin drawn for the image (recorded in the metadata, as the script does).
    pub margin: usize,
}

/// A pixel position: row, column.
type Point = [i32; 2];

/// `p` moved `dist` along `angle` (radians; y down), each coordinate rounded up, as the script's
/// `translate_coord` does.
fn translate(p: Point, angle: f32, dist: f32) -> Point {
    [
        (p[0] as f32 + dist * angle.sin()).ceil() as i32,
        (p[1] as f32 + dist * angle.cos()).ceil() as i32,
    ]
}

/// `angle` turned by half a turn, kept in (-π, π].
fn flip(angle: f32) -> f32 {
    if angle < 0.0 { angle + PI } else { angle - PI }
}

/// A shape's values over a square window of the image.
struct Patch {
    top: i32,
    left: i32,
    side: i32,
    /// The dash (or disc) coverage.
    line: Vec<f32>,
    /// The footprint: the dash widened by the margin.
    footprint: Vec<f32>,
}

impl Patch {
    /// The pixels of the window inside a `size`-pixel image, with their index in the patch.
    fn cells(&self, size: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let size = size as i32;
        (0..self.side).flat_map(move |dy| {
            (0..self.side).filter_map(move |dx| {
                let (y, x) = (self.top + dy, self.left + dx);
                ((0..size).contains(&y) && (0..size).contains(&x))
                    .then_some(((y * size + x) as usize, (dy * self.side + dx) as usize))
            })
        })
    }
}

/// The image being drawn: intensities and how occupied each pixel is.
struct Canvas<'a> {
    params: &'a SnakeParams,
    margin: usize,
    image: Vec<f32>,
    occupied: Vec<f32>,
}

impl<'a> Canvas<'a> {
    fn new(params: &'a SnakeParams, margin: usize) -> Self {
        let n = params.size * params.size;
        Self {
            params,
            margin,
            image: vec![0.0; n],
            occupied: vec![0.0; n],
        }
    }

    fn size(&self) -> i32 {
        self.params.size as i32
    }

    fn inside(&self, p: Point) -> bool {
        (0..self.size()).contains(&p[0]) && (0..self.size()).contains(&p[1])
    }

    /// A paddle from `tail`, `length` pixels along `angle`: its area coverage (flat ends,
    /// `thickness` wide) and its footprint (every point within `thickness / 2 + margin`).
    fn paddle(&self, tail: Point, angle: f32) -> Patch {
        let p = self.params;
        let length = p.paddle_length as f32;
        let half = p.paddle_thickness / 2.0;
        let reach = half + self.margin as f32;
        let radius = (p.paddle_length + p.paddle_thickness.ceil() as usize + self.margin) as i32;
        let (dy, dx) = (angle.sin(), angle.cos());
        let (ty, tx) = (tail[0] as f32, tail[1] as f32);
        coverage_patch(tail, radius, 4 * p.antialias, |y, x| {
            let (ry, rx) = (y - ty, x - tx);
            let along = ry * dy + rx * dx;
            let across = (rx * dy - ry * dx).abs();
            let on_line = (0.0..=length).contains(&along) && across <= half;
            let clamped = along.clamp(0.0, length);
            let (cy, cx) = (ry - clamped * dy, rx - clamped * dx);
            (on_line, cy * cy + cx * cx <= reach * reach)
        })
    }

    /// Whether `patch` may be drawn: its footprint overlaps nothing occupied.
    fn fits(&self, patch: &Patch) -> bool {
        patch
            .cells(self.params.size)
            .all(|(i, j)| self.occupied[i] + patch.footprint[j] < 1.8)
    }

    fn draw(&mut self, patch: &Patch, intensity: f32) {
        for (i, j) in patch.cells(self.params.size) {
            self.image[i] = self.image[i].max(patch.line[j] * intensity);
        }
    }

    fn occupy(&mut self, patch: &Patch) {
        for (i, j) in patch.cells(self.params.size) {
            self.occupied[i] = self.occupied[i].max(patch.footprint[j]);
        }
    }

    /// The occupancy at `p` widened by the margin (a grey dilation with a disc).
    fn occupied_near(&self, p: Point) -> f32 {
        let m = self.margin as i32;
        let mut most = 0.0f32;
        for dy in -m..=m {
            for dx in -m..=m {
                let q = [p[0] + dy, p[1] + dx];
                if dy * dy + dx * dx <= m * m && self.inside(q) {
                    most = most.max(self.occupied[(q[0] * self.size() + q[1]) as usize]);
                }
            }
        }
        most
    }

    /// Whether `p` is within `padding` of the border.
    fn in_border(&self, p: Point, border: i32) -> bool {
        p.iter().any(|&c| c < border || c >= self.size() - border)
    }
}

/// A window of side `2 · radius + 1` centred on `centre`, each pixel's values the share of an
/// `samples x samples` grid of points inside the shapes `inside(y, x)` reports.
fn coverage_patch(
    centre: Point,
    radius: i32,
    samples: usize,
    inside: impl Fn(f32, f32) -> (bool, bool),
) -> Patch {
    let side = 2 * radius + 1;
    let mut line = vec![0.0; (side * side) as usize];
    let mut footprint = line.clone();
    let step = 1.0 / samples as f32;
    let weight = step * step;
    for py in 0..side {
        for px in 0..side {
            let (y0, x0) = (
                (centre[0] - radius + py) as f32 - 0.5,
                (centre[1] - radius + px) as f32 - 0.5,
            );
            let j = (py * side + px) as usize;
            for sy in 0..samples {
                for sx in 0..samples {
                    let (a, b) =
                        inside(y0 + (sy as f32 + 0.5) * step, x0 + (sx as f32 + 0.5) * step);
                    line[j] += weight * f32::from(u8::from(a));
                    footprint[j] += weight * f32::from(u8::from(b));
                }
            }
        }
    }
    Patch {
        top: centre[0] - radius,
        left: centre[1] - radius,
        side,
        line,
        footprint,
    }
}

/// A snake being grown: where its next paddle pivots, its heading, its last paddle.
struct Snake {
    pivot: Point,
    angle: f32,
    last: Patch,
    intensity: f32,
    /// Where its first paddle starts (a marker position).
    origin: Point,
    /// Where its last paddle ends (a marker position).
    end: Point,
}

impl Snake {
    /// A first paddle from `tail` along `angle`, if its end and pivot fall inside the image.
    fn seed(canvas: &Canvas, tail: Point, angle: f32, intensity: f32) -> Option<Self> {
        let length = canvas.params.paddle_length as f32;
        let head = translate(tail, angle, length);
        let pivot = translate(head, flip(angle), length + canvas.margin as f32);
        if !(canvas.inside(head) && canvas.inside(pivot)) {
            return None;
        }
        Some(Self {
            pivot,
            angle,
            last: canvas.paddle(tail, angle),
            intensity,
            origin: tail,
            end: head,
        })
    }

    /// Adds one paddle (`false`: no place found; the canvas is unchanged then).
    fn extend(&mut self, canvas: &mut Canvas, rng: &mut Rng) -> bool {
        let p = canvas.params;
        let margin = canvas.margin as f32;
        let step = p.paddle_length as f32 + margin;
        let pivot = translate(self.pivot, self.angle, step + margin);
        // Candidate ends: the pixels on the circle of radius `step` around the pivot, one per
        // arc of a pixel's length, weighted by turn and by freedom.
        let n_angles = (2.0 * PI * step).ceil() as usize;
        let mut candidates: Vec<(Point, f32, f32)> = Vec::new();
        for k in 0..n_angles {
            let a = k as f32 * 2.0 * PI / n_angles as f32;
            let (y, x) = (
                pivot[0] as f32 + step * a.sin(),
                pivot[1] as f32 + step * a.cos(),
            );
            if y < 0.0 || x < 0.0 || y >= p.size as f32 || x >= p.size as f32 {
                continue;
            }
            let q = [y as i32, x as i32];
            if candidates.iter().any(|c| c.0 == q) {
                continue;
            }
            let heading = ((q[0] - pivot[0]) as f32).atan2((q[1] - pivot[1]) as f32);
            let turn = (heading - self.angle).abs();
            let turn = turn.min(2.0 * PI - turn);
            let smooth = (turn * p.continuity).min(PI / 2.0).cos().max(0.0).powi(2);
            let weight = (1.0 - canvas.occupied_near(q)) * smooth;
            candidates.push((q, heading, weight));
        }
        let total: f32 = candidates.iter().map(|c| c.2).sum();
        if total < 1e-4 {
            return false;
        }
        for _ in 0..PADDLE_TRIALS {
            let mut draw = rng.uniform() as f32 * total;
            let pick = candidates
                .iter()
                .find(|c| {
                    draw -= c.2;
                    draw < 0.0
                })
                .unwrap_or(&candidates[candidates.len() - 1]);
            let (head, heading) = (pick.0, pick.1);
            let paddle = canvas.paddle(head, flip(heading));
            if canvas.fits(&paddle) {
                canvas.draw(&paddle, self.intensity);
                let previous = std::mem::replace(&mut self.last, paddle);
                canvas.occupy(&previous);
                self.pivot = pivot;
                self.angle = heading;
                self.end = head;
                return true;
            }
        }
        false
    }
}

/// A whole-degree orientation in [-180°, 180°), in radians.
fn random_angle(rng: &mut Rng) -> f32 {
    (rng.below(360) as f32 - 180.0) * PI / 180.0
}

/// Two target snakes of `contour_length` paddles, seeds `seed_distance` apart; `None` when they
/// could not both be completed.
fn target_pair(canvas: &mut Canvas, rng: &mut Rng, contour_length: usize) -> Option<[Snake; 2]> {
    let p = canvas.params;
    let intensity = p.paddle_contrast * p.snake_contrast;
    let border = (2 * p.seed_distance).max(p.padding) as i32;
    let free = p.size as i32 - 2 * border;
    if free <= 0 {
        return None;
    }
    let first = (0..PADDLE_TRIALS).find_map(|_| {
        let tail = [
            border + rng.below(free as usize) as i32,
            border + rng.below(free as usize) as i32,
        ];
        Snake::seed(canvas, tail, random_angle(rng), intensity)
    })?;
    let second = (0..PADDLE_TRIALS).find_map(|_| {
        let angle = random_angle(rng);
        let direction = rng.below(360) as f32 * PI / 180.0;
        let d = p.seed_distance as f32;
        let tail = [
            (first.origin[0] as f32 + d * direction.sin()).round() as i32,
            (first.origin[1] as f32 + d * direction.cos()).round() as i32,
        ];
        Snake::seed(canvas, tail, angle, intensity)
    })?;
    let mut pair = [first, second];
    for snake in &pair {
        canvas.draw(&snake.last, intensity);
    }
    for _ in 1..contour_length {
        for snake in &mut pair {
            if !snake.extend(canvas, rng) {
                return None;
            }
        }
    }
    for snake in &pair {
        canvas.occupy(&snake.last);
    }
    Some(pair)
}

/// One distractor snake of `length` paddles, seeded where its first paddle touches nothing;
/// `false` when it could not be completed (the canvas is then unchanged).
fn distractor(canvas: &mut Canvas, rng: &mut Rng, length: usize) -> bool {
    let p = canvas.params;
    let angle = random_angle(rng);
    let border = p.padding as i32;
    // Free tails: no border or occupied pixel under the first paddle's full footprint.
    let probe = canvas.paddle([0, 0], angle);
    let solid: Vec<(i32, i32)> = (0..probe.side)
        .flat_map(|dy| (0..probe.side).map(move |dx| (dy, dx)))
        .filter(|&(dy, dx)| probe.footprint[(dy * probe.side + dx) as usize] >= 0.999)
        .map(|(dy, dx)| (probe.top + dy, probe.left + dx))
        .collect();
    let size = canvas.size();
    let free: Vec<Point> = (0..size * size)
        .map(|i| [i / size, i % size])
        .filter(|&t| {
            solid.iter().all(|&(dy, dx)| {
                let q = [t[0] + dy, t[1] + dx];
                canvas.inside(q)
                    && !canvas.in_border(q, border)
                    && canvas.occupied[(q[0] * size + q[1]) as usize] <= 0.3
            })
        })
        .collect();
    if free.is_empty() {
        return false;
    }
    let tail = free[rng.below(free.len())];
    let Some(mut snake) = Snake::seed(canvas, tail, angle, p.snake_contrast) else {
        return false;
    };
    let (image, occupied) = (canvas.image.clone(), canvas.occupied.clone());
    canvas.draw(&snake.last, snake.intensity);
    for _ in 1..length {
        if !snake.extend(canvas, rng) {
            canvas.image = image;
            canvas.occupied = occupied;
            return false;
        }
    }
    canvas.occupy(&snake.last);
    true
}

/// A marker disc of `radius` at `centre`.
fn marker(canvas: &Canvas, centre: Point) -> Patch {
    let r = canvas.params.marker_radius;
    let (cy, cx) = (centre[0] as f32, centre[1] as f32);
    coverage_patch(
        centre,
        r.ceil() as i32 + 1,
        4 * canvas.params.antialias,
        |y, x| {
            let inside = (y - cy).powi(2) + (x - cx).powi(2) <= r * r;
            (inside, inside)
        },
    )
}

/// Generates one image with `label` (1: markers on the same snake) and targets of
/// `contour_length` paddles, drawing every random choice from `rng`.
pub fn generate(
    params: &SnakeParams,
    contour_length: usize,
    label: usize,
    rng: &mut Rng,
) -> anyhow::Result<PathfinderImage> {
    let margin = params.paddle_margins[rng.below(params.paddle_margins.len())];
    let found = (0..PAIR_TRIALS).find_map(|_| {
        let mut canvas = Canvas::new(params, margin);
        target_pair(&mut canvas, rng, contour_length).map(|pair| (canvas, pair))
    });
    let Some((mut canvas, pair)) = found else {
        anyhow::bail!(
            "no pair of {contour_length}-paddle paths fits a {0} x {0} image in {PAIR_TRIALS} tries",
            params.size
        );
    };
    for _ in 0..params.distractor_count(contour_length) {
        for _ in 0..DISTRACTOR_TRIALS {
            if distractor(&mut canvas, rng, params.distractor_length(contour_length)) {
                break;
            }
        }
    }
    let origin = rng.below(2);
    let terminal = if label == 1 { origin } else { 1 - origin };
    for centre in [pair[origin].origin, pair[terminal].end] {
        let disc = marker(&canvas, centre);
        canvas.draw(&disc, 1.0);
    }
    let top = canvas
        .image
        .iter()
        .cloned()
        .fold(0.0f32, f32::max)
        .max(1e-6);
    let pixels = canvas
        .image
        .iter()
        .map(|v| (v / top * 255.0).round().clamp(0.0, 255.0) as u8)
        .collect();
    Ok(PathfinderImage {
        pixels,
        label,
        margin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Distractor counts as the scripts compute them: `20 // (cl // 3)` at 32 pixels,
    /// `while i < budget / (cl / 3)` (rounded up) at 64 and 128.
    #[test]
    fn distractor_counts_follow_the_scripts() {
        let p32 = SnakeParams::lra(32).unwrap();
        let p128 = SnakeParams::lra(128).unwrap();
        assert_eq!(
            [6, 9, 14].map(|cl| (p32.distractor_length(cl), p32.distractor_count(cl))),
            [(2, 10), (3, 6), (4, 5)]
        );
        // 35 / (14 / 3) = 7.5 -> 8 snakes of int(4.67) = 4 paddles.
        assert_eq!(
            [6, 9, 14].map(|cl| (p128.distractor_length(cl), p128.distractor_count(cl))),
            [(2, 18), (3, 12), (4, 8)]
        );
    }

    /// Same seed, same image; values span 0-255; a plausible share of the image is drawn.
    #[test]
    fn images_are_deterministic_balanced_and_in_range() {
        let params = SnakeParams::lra(32).unwrap();
        let a = generate(&params, 14, 1, &mut Rng::new(5)).unwrap();
        let b = generate(&params, 14, 1, &mut Rng::new(5)).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.pixels.len(), 32 * 32);
        assert_eq!(a.pixels.iter().max(), Some(&255));
        // Dashes, distractors and markers cover a fair share but not most of the image.
        let lit = a.pixels.iter().filter(|&&v| v > 40).count();
        assert!((60..600).contains(&lit), "{lit} lit pixels");
    }
}
