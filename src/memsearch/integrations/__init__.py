"""Integrations with other training stacks. Each one imports its framework lazily: the base
package never needs it (docs/design.md §13)."""
