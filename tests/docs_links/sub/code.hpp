// A header whose comments cite sections (the checker's fixture).
/// Resolves: (good.md, "The filter's divisions, its state"); wrapped over two lines:
/// (sub/other.md, "A step-by-step
/// guide"), `good.md`, "results", and "not a citation" alone.
// Broken: the section moved away (good.md, "A fast VM of the same kind").
// Broken, wrapped over two lines: (sub/other.md, "A step-by-step
// guide, twenty-first session").
int fixture = 0;
