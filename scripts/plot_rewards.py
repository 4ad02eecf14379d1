"""Plot a training run's reward curve: python scripts/plot_rewards.py RUN/train_log.jsonl OUT.png"""

import sys

from memsearch.train.plot import plot_rewards

if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    print(plot_rewards(sys.argv[1], sys.argv[2]))
