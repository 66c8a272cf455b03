"""Applications built on the library layers (``vla demo``). Nothing under vlastack/ outside this
package imports it."""
