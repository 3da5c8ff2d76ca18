# The first rows' sources of the mixture draw (src/meshtrain/data/mixture.h), computed independently of the
# engine in exact rational arithmetic: row n comes from the source whose count is furthest below
# share x (n + 1), ties to the lowest index. Prints what tests/unit/data/test_mixture.cpp pins.
from fractions import Fraction


def sources(weights, rows):
    shares = [Fraction(w) / sum(Fraction(v) for v in weights) for w in weights]
    counts = [0] * len(weights)
    order = []
    for n in range(rows):
        errors = [shares[i] * (n + 1) - counts[i] for i in range(len(weights))]
        best = errors.index(max(errors))  # index() takes the first, the lowest, of equal maxima
        counts[best] += 1
        order.append(best)
    return order


for weights in (["0.5", "0.3", "0.2"], ["1", "1", "1"], ["3", "1"]):
    print(weights, "".join(str(s) for s in sources(weights, 40)))
