# The first rows' sources of the mixture draw (src/meshtrain/data/mixture.h), computed independently of the
# engine in exact rational arithmetic with Tijdeman's chairman-assignment rule (R. Tijdeman, "The chairman
# assignment problem", Discrete Mathematics 32, 1980): with k sources and D = 2k - 2, row t (from 1) may come
# from a source whose count is at least 1 / D below share x t; of those, from the one whose deadline
# (count + 1 - 1 / D) / share is earliest, ties to the lowest index. Every count then stays within
# 1 - 1 / D of share x t. Prints what tests/unit/data/test_mixture.cpp pins, and checks the bound on random
# mixtures of up to 8 sources.
import random
from fractions import Fraction


def sources(weights, rows):
    shares = [Fraction(w) / sum(Fraction(v) for v in weights) for w in weights]
    k = len(shares)
    counts = [0] * k
    order = []
    worst = Fraction(0)
    for t in range(1, rows + 1):
        if k == 1:
            best = 0
        else:
            slack = Fraction(1, 2 * k - 2)
            eligible = [i for i in range(k) if shares[i] * t - counts[i] >= slack]
            best = min(eligible, key=lambda i: ((counts[i] + 1 - slack) / shares[i], i))
        counts[best] += 1
        order.append(best)
        worst = max(worst, max(abs(shares[i] * t - counts[i]) for i in range(k)))
    return order, worst


for weights in (["0.5", "0.3", "0.2"], ["1", "1", "1"], ["3", "1"]):
    print(weights, "".join(str(s) for s in sources(weights, 40)[0]))

random.seed(1)
for trial in range(100):
    k = random.randint(2, 8)
    weights = [random.randint(1, 1000) for _ in range(k)]
    worst = sources(weights, 1000)[1]
    assert worst <= 1 - Fraction(1, 2 * k - 2), (weights, worst)
print("bound 1 - 1/(2k - 2) held on 100 random mixtures of 2..8 sources")
